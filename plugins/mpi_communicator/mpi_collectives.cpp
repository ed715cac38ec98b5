// mpi_collectives.cpp -- all_to_all_v, all_gather and barrier over nonblocking point-to-point.
//
// all_to_all_v first exchanges the byte counts (each rank tells each peer how much it will send) and
// then agrees on a verdict (each rank tells every peer what mismatches it saw), so that a mismatch is
// refused with CAD_STATUS_COMMUNICATION on every rank alike, before any payload moves.
#include "mpi_collectives.h"

#include <cstring>
#include <vector>

#include "mpi_requests.h"

namespace cad::mpi_comm {

using plugin::fail;
using plugin::format;

namespace {

enum Phase { kCountsTag = 0, kVerdictTag = 1, kDataTag = 2, kBarrierTag = 3 };

// What one rank found when it compared the counts announced to it with the counts it expects.
struct Verdict {
  int64_t mismatches = 0;  // how many peers disagree with this rank
  int64_t sender = -1;     // the first disagreement: `sender` sends `sent` bytes to this rank,
  int64_t sent = 0;        //   which expects `expected`
  int64_t expected = 0;
};


// Runs `body`; a timeout or MPI error leaves the group in an unknown state, so the instance is
// marked unusable before the failure goes on to the ABI boundary.
template <class Body>
void breaking_on_failure(MpiContext& ctx, Body&& body) {
  try {
    body();
  } catch (const plugin::Failure& f) {
    ctx.mark_broken(f.what());
    throw;
  }
}

std::vector<Verdict> agree_on_counts(MpiContext& ctx, const uint64_t* send_counts, const uint64_t* recv_counts,
                                     int tag_base, const Deadline& deadline) {
  const int world = ctx.world_size(), me = ctx.rank();
  // 1. Tell every peer how many bytes it will get from us.
  std::vector<uint64_t> announced(static_cast<size_t>(world), 0);
  announced[static_cast<size_t>(me)] = send_counts[me];
  {
    RequestSet exchange(ctx.comm(), "all_to_all_v", ctx.config().chunk_bytes);
    for (int p = 0; p < world; ++p) {
      if (p == me) continue;
      exchange.receive(&announced[static_cast<size_t>(p)], sizeof(uint64_t), p, tag_base + kCountsTag);
      exchange.send(&send_counts[p], sizeof(uint64_t), p, tag_base + kCountsTag);
    }
    exchange.wait_all("byte-count exchange", deadline);
  }
  // 2. Compare with what we expect, and let every rank know what we found, so all agree.
  Verdict mine;
  for (int p = 0; p < world; ++p) {
    if (announced[static_cast<size_t>(p)] == recv_counts[p]) continue;
    if (mine.mismatches++ == 0) {
      mine.sender = p;
      mine.sent = static_cast<int64_t>(announced[static_cast<size_t>(p)]);
      mine.expected = static_cast<int64_t>(recv_counts[p]);
    }
  }
  std::vector<Verdict> verdicts(static_cast<size_t>(world));
  verdicts[static_cast<size_t>(me)] = mine;
  RequestSet agreement(ctx.comm(), "all_to_all_v", ctx.config().chunk_bytes);
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    agreement.receive(&verdicts[static_cast<size_t>(p)], sizeof(Verdict), p, tag_base + kVerdictTag);
    agreement.send(&mine, sizeof(Verdict), p, tag_base + kVerdictTag);
  }
  agreement.wait_all("mismatch agreement", deadline);
  return verdicts;
}

// Every rank builds the same message from the same verdicts.
[[noreturn]] void refuse_mismatch(const std::vector<Verdict>& verdicts) {
  std::string detail;
  int64_t total = 0;
  for (size_t r = 0; r < verdicts.size(); ++r) {
    const Verdict& v = verdicts[r];
    if (v.mismatches == 0) continue;
    total += v.mismatches;
    if (detail.size() < 400) {
      detail += format("%srank %lld sends %lld bytes to rank %zu, which expects %lld", detail.empty() ? "" : "; ",
                       static_cast<long long>(v.sender), static_cast<long long>(v.sent), r,
                       static_cast<long long>(v.expected));
    }
  }
  fail(CAD_STATUS_COMMUNICATION,
       format("all_to_all_v: byte counts disagree between ranks (%lld mismatched pair(s)): %s; nothing was sent",
              static_cast<long long>(total), detail.c_str()));
}

}  // namespace

void all_to_all_v(MpiContext& ctx, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                  void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs) {
  const int world = ctx.world_size(), me = ctx.rank();
  plugin::check_byte_layout("send", send, send_counts, send_displs, world);
  plugin::check_byte_layout("recv", recv, recv_counts, recv_displs, world);
  if (send_counts[me] != recv_counts[me] && !ctx.config().verify_counts) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("all_to_all_v: send_counts[%d] (%llu) must equal recv_counts[%d] (%llu) for the message to self", me,
                static_cast<unsigned long long>(send_counts[me]), me,
                static_cast<unsigned long long>(recv_counts[me])));
  }
  ctx.check_usable();
  const int tag_base = ctx.next_tag_base();
  const Deadline deadline = Deadline::after_ms(ctx.config().timeout_ms);

  std::vector<Verdict> verdicts;
  breaking_on_failure(ctx, [&] {
    if (ctx.config().verify_counts) verdicts = agree_on_counts(ctx, send_counts, recv_counts, tag_base, deadline);
  });
  for (const Verdict& v : verdicts) {
    if (v.mismatches > 0) refuse_mismatch(verdicts);  // consistent on every rank; the instance stays usable
  }

  breaking_on_failure(ctx, [&] {
    const char* send_bytes = static_cast<const char*>(send);
    char* recv_bytes = static_cast<char*>(recv);
    RequestSet data(ctx.comm(), "all_to_all_v", ctx.config().chunk_bytes);
    for (int p = 0; p < world; ++p) {
      if (p != me) data.receive(recv_bytes + recv_displs[p], recv_counts[p], p, tag_base + kDataTag);
    }
    for (int p = 0; p < world; ++p) {
      if (p != me) data.send(send_bytes + send_displs[p], send_counts[p], p, tag_base + kDataTag);
    }
    if (send_counts[me] > 0) std::memcpy(recv_bytes + recv_displs[me], send_bytes + send_displs[me], send_counts[me]);
    data.wait_all("data", deadline);
  });
}

void all_gather(MpiContext& ctx, const void* send, uint64_t bytes, void* recv) {
  const int world = ctx.world_size(), me = ctx.rank();
  if (bytes > 0 && send == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "all_gather: send is NULL but bytes > 0");
  if (bytes > 0 && recv == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "all_gather: recv is NULL but bytes > 0");
  if (bytes > UINT64_MAX / static_cast<uint64_t>(world)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "all_gather: world_size * bytes overflows");
  }
  ctx.check_usable();
  const int tag_base = ctx.next_tag_base();
  const Deadline deadline = Deadline::after_ms(ctx.config().timeout_ms);
  breaking_on_failure(ctx, [&] {
    char* recv_bytes = static_cast<char*>(recv);
    // Sizes are not exchanged first: a rank whose `bytes` differs is caught by the size check on
    // arrival (or, when chunking hides it, by the deadline).
    RequestSet data(ctx.comm(), "all_gather", ctx.config().chunk_bytes);
    for (int p = 0; p < world; ++p) {
      if (p != me) data.receive(recv_bytes + static_cast<uint64_t>(p) * bytes, bytes, p, tag_base + kDataTag);
    }
    for (int p = 0; p < world; ++p) {
      if (p != me) data.send(send, bytes, p, tag_base + kDataTag);
    }
    if (bytes > 0) std::memcpy(recv_bytes + static_cast<uint64_t>(me) * bytes, send, bytes);
    data.wait_all("data", deadline);
  });
}

void barrier(MpiContext& ctx) {
  const int world = ctx.world_size(), me = ctx.rank();
  ctx.check_usable();
  const int tag_base = ctx.next_tag_base();
  const Deadline deadline = Deadline::after_ms(ctx.config().timeout_ms);
  breaking_on_failure(ctx, [&] {
    // Every rank tells every other that it arrived: O(world) tiny messages per rank, but a timeout
    // can name exactly the ranks that have not arrived.
    static const char token = 1;  // static: an abandoned send may still read it after we return
    std::vector<char> arrived(static_cast<size_t>(world), 0);
    RequestSet tokens(ctx.comm(), "barrier", ctx.config().chunk_bytes);
    for (int p = 0; p < world; ++p) {
      if (p == me) continue;
      tokens.receive(&arrived[static_cast<size_t>(p)], 1, p, tag_base + kBarrierTag);
      tokens.send(&token, 1, p, tag_base + kBarrierTag);
    }
    tokens.wait_all("waiting for every rank to arrive", deadline);
  });
}

}  // namespace cad::mpi_comm
