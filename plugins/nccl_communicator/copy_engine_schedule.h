// copy_engine_schedule.h -- the rounds of one all_to_all_v by the copy engines (nccl_copy_engine.h), as plain data:
// what each peer's send stream and receive stream do, in order. Pure (no CUDA), so that the CPU tests run every
// rank's schedule against the others' (tests/copy_engine/): no deadlock, no slot overwritten before it was read.
//
// The protocol, per ordered pair (sender s, receiver p): a message of n bytes moves in ceil(n / slot_bytes) rounds;
// the pair's rounds are numbered 1, 2, ... over the instance's life (both sides count alike: the calls are
// collective and the pair's counts agree) and round k uses p's slot (s, k % 2). Sender: wait until p's consumed
// count for s is at least k - 2 (the slot's last use was read), copy round k into the slot, set p's full count for s
// to k. Receiver: wait until its full count for s is at least k, copy the slot out, set s's consumed count for p to
// k. Each peer has a send stream and a receive stream of its own, so a pair's progress never waits for another
// pair's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace cad::nccl_comm::copy_engine {

struct Op {
  enum Kind {
    WaitConsumed,    // send stream: until the peer consumed `round` (a round number >= 1)
    CopyToSlot,      // send stream: message bytes [offset, offset + bytes) into the peer's slot for this rank
    SignalFull,      // send stream: the peer's full count for this rank := round
    WaitFull,        // receive stream: until this rank's full count for the peer >= round
    CopyFromSlot,    // receive stream: this rank's slot for the peer into recv bytes [offset, offset + bytes)
    SignalConsumed,  // receive stream: the peer's consumed count for this rank := round
  };
  Kind kind;
  uint64_t round;
  uint64_t offset = 0, bytes = 0;  // the copies only: within the message
};

// Slot (sender, round) in a receiver's staging area: two per sender, alternating.
inline uint64_t slot_index(int sender, uint64_t round) { return static_cast<uint64_t>(sender) * 2 + round % 2; }

struct PeerOps {
  std::vector<Op> send, receive;
};

// Per peer (world entries; the rank's own is empty: its message to itself is one local copy): the ops of one
// all_to_all_v, advancing `sent_rounds` and `received_rounds` (per peer, over the instance's life).
inline std::vector<PeerOps> schedule(int rank, int world, const uint64_t* send_counts, const uint64_t* recv_counts,
                                     uint64_t slot_bytes, std::vector<uint64_t>& sent_rounds,
                                     std::vector<uint64_t>& received_rounds) {
  std::vector<PeerOps> ops(static_cast<size_t>(world));
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    const size_t pi = static_cast<size_t>(p);
    for (uint64_t done = 0; done < send_counts[pi]; done += slot_bytes) {
      const uint64_t k = ++sent_rounds[pi];
      const uint64_t n = std::min(slot_bytes, send_counts[pi] - done);
      if (k > 2) ops[pi].send.push_back({Op::WaitConsumed, k - 2});
      ops[pi].send.push_back({Op::CopyToSlot, k, done, n});
      ops[pi].send.push_back({Op::SignalFull, k});
    }
    for (uint64_t done = 0; done < recv_counts[pi]; done += slot_bytes) {
      const uint64_t k = ++received_rounds[pi];
      const uint64_t n = std::min(slot_bytes, recv_counts[pi] - done);
      ops[pi].receive.push_back({Op::WaitFull, k});
      ops[pi].receive.push_back({Op::CopyFromSlot, k, done, n});
      ops[pi].receive.push_back({Op::SignalConsumed, k});
    }
  }
  return ops;
}

}  // namespace cad::nccl_comm::copy_engine
