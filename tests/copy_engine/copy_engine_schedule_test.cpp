// copy_engine_schedule_test.cpp -- the copy-engine all-to-all's rounds (copy_engine_schedule.h) run as the GPUs would
// run them, on the CPU: every rank's per-peer send and receive streams, each a queue of ops, advanced one op at a
// time in a random order (any stream whose head can go), over several calls whose counts change. A call's ops start
// once the rank's previous call finished on all its streams (the caller's stream joins them before the next fork).
// Checked: nobody waits forever (no deadlock), a slot is never written while it holds bytes not yet read, every
// receiver reads exactly the bytes its sender wrote for that call and offset, and both sides of a pair count the same
// rounds.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "copy_engine_schedule.h"

namespace ce = cad::nccl_comm::copy_engine;
using ce::Op;

namespace {

struct SlotContent {
  bool unread = false;
  int sender = -1, call = -1;
  uint64_t round = 0, offset = 0, bytes = 0;
};

struct Stream {
  std::vector<Op> ops;
  size_t next = 0;
  bool done() const { return next == ops.size(); }
};

struct Rank {
  std::vector<uint64_t> full, consumed;                 // full[s]: sender s's rounds in my slots; consumed[p]
  std::map<uint64_t, SlotContent> slots;                // slot_index -> content
  std::vector<Stream> send, receive;                    // per peer
  std::vector<uint64_t> sent_rounds, received_rounds;  // the schedule's counters
  int call = -1;                                        // the call whose ops are in the streams
  uint64_t bytes_read = 0;
};

// Counts of one call: sent[s][p] bytes from s to p, as a multiple of the slot or not, zero or not.
using Counts = std::vector<std::vector<uint64_t>>;

Counts random_counts(int world, uint64_t slot, std::mt19937_64& rng) {
  Counts c(static_cast<size_t>(world), std::vector<uint64_t>(static_cast<size_t>(world), 0));
  std::uniform_int_distribution<int> pick(0, 4);
  for (auto& row : c) {
    for (uint64_t& n : row) {
      switch (pick(rng)) {
        case 0: n = 0; break;
        case 1: n = 1 + rng() % slot; break;                       // one round
        case 2: n = slot * (1 + rng() % 4); break;                 // whole rounds
        default: n = 1 + rng() % (7 * slot); break;                // several, the last short
      }
    }
  }
  return c;
}

// Runs `calls` on `world` ranks; returns "" or what went wrong. `edit` may change each rank's ops (a broken schedule).
std::string simulate(int world, uint64_t slot, const std::vector<Counts>& calls, uint64_t seed,
                     const std::function<void(std::vector<ce::PeerOps>&)>& edit = nullptr) {
  const size_t w = static_cast<size_t>(world);
  std::vector<Rank> ranks(w);
  for (Rank& r : ranks) {
    r.full.assign(w, 0), r.consumed.assign(w, 0), r.sent_rounds.assign(w, 0), r.received_rounds.assign(w, 0);
    r.send.assign(w, Stream{}), r.receive.assign(w, Stream{});
  }
  std::vector<uint64_t> expected_read(w, 0);
  for (const Counts& c : calls) {
    for (size_t r = 0; r < w; ++r) {
      for (size_t s = 0; s < w; ++s) expected_read[r] += s == r ? 0 : c[s][r];
    }
  }
  // Once every stream of the rank is done, its next call's ops (calls with none for this rank complete at once).
  const auto start_next_call = [&](size_t r) {
    Rank& me = ranks[r];
    for (;;) {
      for (size_t p = 0; p < w; ++p) {
        if (!me.send[p].done() || !me.receive[p].done()) return;
      }
      if (me.call + 1 >= static_cast<int>(calls.size())) return;
      ++me.call;
      const Counts& c = calls[static_cast<size_t>(me.call)];
      std::vector<uint64_t> sends(w), recvs(w);
      for (size_t p = 0; p < w; ++p) sends[p] = c[r][p], recvs[p] = c[p][r];
      std::vector<ce::PeerOps> ops = ce::schedule(static_cast<int>(r), world, sends.data(), recvs.data(), slot,
                                                  me.sent_rounds, me.received_rounds);
      if (edit) edit(ops);
      for (size_t p = 0; p < w; ++p) me.send[p] = Stream{ops[p].send}, me.receive[p] = Stream{ops[p].receive};
    }
  };
  for (size_t r = 0; r < w; ++r) start_next_call(r);

  std::mt19937_64 rng(seed);
  for (;;) {
    // Every stream whose next op can go now.
    std::vector<std::pair<size_t, std::pair<size_t, bool>>> ready;  // rank, (peer, sending)
    bool all_done = true;
    for (size_t r = 0; r < w; ++r) {
      for (size_t p = 0; p < w; ++p) {
        for (bool sending : {true, false}) {
          const Stream& st = sending ? ranks[r].send[p] : ranks[r].receive[p];
          if (st.done()) continue;
          all_done = false;
          const Op& op = st.ops[st.next];
          const bool blocked = (op.kind == Op::WaitConsumed && ranks[r].consumed[p] < op.round) ||
                               (op.kind == Op::WaitFull && ranks[r].full[p] < op.round);
          if (!blocked) ready.push_back({r, {p, sending}});
        }
      }
    }
    if (all_done) break;
    if (ready.empty()) {
      std::ostringstream why;
      why << "deadlock: every stream waits (" << world << " ranks, seed " << seed << ")";
      return why.str();
    }
    const auto [r, where] = ready[rng() % ready.size()];
    const auto [p, sending] = where;
    Rank& me = ranks[r];
    Stream& st = sending ? me.send[p] : me.receive[p];
    const Op op = st.ops[st.next++];
    std::ostringstream why;
    why << "rank " << r << ", peer " << p << ", call " << me.call << ", round " << op.round << ": ";
    switch (op.kind) {
      case Op::WaitConsumed:
      case Op::WaitFull:
        break;
      case Op::CopyToSlot: {
        SlotContent& slot_of_peer = ranks[p].slots[ce::slot_index(static_cast<int>(r), op.round)];
        if (slot_of_peer.unread) return why.str() + "overwrote a slot holding bytes not yet read";
        slot_of_peer = SlotContent{true, static_cast<int>(r), me.call, op.round, op.offset, op.bytes};
        break;
      }
      case Op::SignalFull:
        if (ranks[p].full[r] > op.round) return why.str() + "full count went back";
        ranks[p].full[r] = op.round;
        break;
      case Op::CopyFromSlot: {
        SlotContent& mine = me.slots[ce::slot_index(static_cast<int>(p), op.round)];
        if (!mine.unread) return why.str() + "read a slot with nothing new in it";
        if (mine.sender != static_cast<int>(p) || mine.call != me.call || mine.round != op.round ||
            mine.offset != op.offset || mine.bytes != op.bytes) {
          return why.str() + "read bytes of another call, round or offset";
        }
        mine.unread = false;
        me.bytes_read += op.bytes;
        break;
      }
      case Op::SignalConsumed:
        if (ranks[p].consumed[r] > op.round) return why.str() + "consumed count went back";
        ranks[p].consumed[r] = op.round;
        break;
    }
    start_next_call(r);
  }
  for (size_t r = 0; r < w; ++r) {
    if (ranks[r].bytes_read != expected_read[r]) return "rank " + std::to_string(r) + " read the wrong number of bytes";
    for (size_t p = 0; p < w; ++p) {
      if (ranks[r].sent_rounds[p] != ranks[p].received_rounds[r]) {
        return "ranks " + std::to_string(r) + " and " + std::to_string(p) + " counted different rounds";
      }
    }
  }
  return "";
}

}  // namespace

TEST(CopyEngineSchedule, RoundsSplitTheMessageIntoSlotsAndAlternate) {
  std::vector<uint64_t> sent(2, 0), received(2, 0);
  const uint64_t send_counts[2] = {0, 10}, recv_counts[2] = {0, 4};
  const auto ops = ce::schedule(0, 2, send_counts, recv_counts, 4, sent, received);
  // 10 bytes in slots of 4: rounds 1 (0-4), 2 (4-8), 3 (8-10); round 3 first waits for round 1's slot.
  ASSERT_EQ(ops[1].send.size(), 3u * 3u - 2u);
  EXPECT_EQ(ops[1].send[0].kind, Op::CopyToSlot);
  EXPECT_EQ(ops[1].send[1].kind, Op::SignalFull);
  EXPECT_EQ(ops[1].send[2].kind, Op::CopyToSlot);
  EXPECT_EQ(ops[1].send[2].offset, 4u);
  EXPECT_EQ(ops[1].send[4].kind, Op::WaitConsumed);
  EXPECT_EQ(ops[1].send[4].round, 1u);
  EXPECT_EQ(ops[1].send[5].offset, 8u);
  EXPECT_EQ(ops[1].send[5].bytes, 2u);
  EXPECT_EQ(ops[1].send[6].round, 3u);
  EXPECT_TRUE(ops[0].send.empty() && ops[0].receive.empty());  // self: a local copy, no rounds
  ASSERT_EQ(ops[1].receive.size(), 3u);
  EXPECT_EQ(ops[1].receive[0].kind, Op::WaitFull);
  EXPECT_EQ(sent[1], 3u);
  EXPECT_EQ(received[1], 1u);
  EXPECT_NE(ce::slot_index(1, 1), ce::slot_index(1, 2));
  EXPECT_EQ(ce::slot_index(1, 1), ce::slot_index(1, 3));
  EXPECT_NE(ce::slot_index(0, 1), ce::slot_index(1, 1));
}

TEST(CopyEngineSchedule, RandomInterleavingsNeverDeadlockNorOverwrite) {
  std::mt19937_64 rng(20261128);
  for (int world = 2; world <= 6; ++world) {
    for (int trial = 0; trial < 60; ++trial) {
      const uint64_t slot = 1 + rng() % 8;
      std::vector<Counts> calls(1 + rng() % 6);
      for (Counts& c : calls) c = random_counts(world, slot, rng);
      const std::string failure = simulate(world, slot, calls, rng());
      ASSERT_EQ(failure, "") << world << " ranks, trial " << trial;
    }
  }
}

// The checker can fail: without the wait for the slot's last reader, some interleaving overwrites unread bytes.
TEST(CopyEngineSchedule, WithoutTheConsumedWaitASlotIsOverwritten) {
  const auto drop_waits = [](std::vector<ce::PeerOps>& ops) {
    for (ce::PeerOps& peer : ops) {
      std::vector<Op> kept;
      for (const Op& op : peer.send) {
        if (op.kind != Op::WaitConsumed) kept.push_back(op);
      }
      peer.send = kept;
    }
  };
  std::mt19937_64 rng(7);
  int caught = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const std::vector<Counts> calls = {Counts{{0, 40}, {40, 0}}};  // 10 rounds each way in slots of 4
    const std::string failure = simulate(2, 4, calls, rng(), drop_waits);
    if (!failure.empty()) {
      EXPECT_NE(failure.find("overwrote a slot"), std::string::npos) << failure;
      ++caught;
    }
  }
  EXPECT_GT(caught, 0);
}
