// host_communicator_test.cpp -- plugin "host" forwards CAD's collectives to the ones its host lends (ABI v1.1
// services). Ranks are threads, each with its own cad_host_t; the lent collectives are shared memory with a
// deadline, the way torch.distributed's are lent by the Python package.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cad_host.h"

namespace {

// Shared memory "process group": a generation barrier with a deadline, and per-rank published pointers.
struct World {
  explicit World(int n) : size(n), sends(n), send_counts(n), send_displs(n) {}
  int size;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<const uint8_t*> sends;
  std::vector<const uint64_t*> send_counts, send_displs;
  std::vector<uint8_t> gathered;

  bool barrier(int64_t timeout_ms) {
    std::unique_lock<std::mutex> lock(mutex);
    const uint64_t mine = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    if (cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return generation != mine; })) return true;
    --arrived;  // give up: this rank leaves the barrier
    return false;
  }
};

struct Rank {
  World* world;
  int rank;
  int gathers = 0;  // how often the host's all_gather was called
};

cad_status_t timed_out(char* error, size_t capacity, const char* what) {
  std::snprintf(error, capacity, "%s: a peer did not arrive in time", what);
  return CAD_STATUS_TIMEOUT;
}

cad_status_t lent_all_gather(void* user, const void* send, uint64_t bytes, void* recv, int64_t timeout_ms, char* error,
                             size_t capacity) {
  Rank& r = *static_cast<Rank*>(user);
  World& w = *r.world;
  ++r.gathers;
  if (!w.barrier(timeout_ms)) return timed_out(error, capacity, "test all_gather (enter)");
  w.sends[r.rank] = static_cast<const uint8_t*>(send);
  if (!w.barrier(timeout_ms)) return timed_out(error, capacity, "test all_gather (publish)");
  for (int p = 0; p < w.size; ++p) {
    if (bytes > 0) std::memcpy(static_cast<uint8_t*>(recv) + p * bytes, w.sends[p], bytes);
  }
  if (!w.barrier(timeout_ms)) return timed_out(error, capacity, "test all_gather (leave)");
  return CAD_STATUS_OK;
}

cad_status_t lent_all_to_all_v(void* user, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                               void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, int64_t timeout_ms,
                               char* error, size_t capacity) {
  Rank& r = *static_cast<Rank*>(user);
  World& w = *r.world;
  if (!w.barrier(timeout_ms)) return timed_out(error, capacity, "test all_to_all_v (enter)");
  w.sends[r.rank] = static_cast<const uint8_t*>(send);
  w.send_counts[r.rank] = send_counts;
  w.send_displs[r.rank] = send_displs;
  if (!w.barrier(timeout_ms)) return timed_out(error, capacity, "test all_to_all_v (publish)");
  for (int p = 0; p < w.size; ++p) {
    const uint64_t n = w.send_counts[p][r.rank];
    if (n != recv_counts[p]) {
      std::snprintf(error, capacity, "size mismatch the plugin should have caught");
      return CAD_STATUS_INTERNAL;
    }
    if (n > 0) std::memcpy(static_cast<uint8_t*>(recv) + recv_displs[p], w.sends[p] + w.send_displs[p][r.rank], n);
  }
  if (!w.barrier(timeout_ms)) return timed_out(error, capacity, "test all_to_all_v (leave)");
  return CAD_STATUS_OK;
}

cad_status_t lent_barrier(void* user, int64_t timeout_ms, char* error, size_t capacity) {
  Rank& r = *static_cast<Rank*>(user);
  return r.world->barrier(timeout_ms) ? CAD_STATUS_OK : timed_out(error, capacity, "test barrier");
}

const char* kConfig = R"({"instances": [{"name": "comm", "plugin": "host", "config": {"timeout_ms": 2000}}]})";

// One rank's stack: cad_host_t with the collectives lent, and the communicator instance.
struct Stack {
  cad_host_t* host = nullptr;
  const cad_communicator_v1_t* comm = nullptr;
  void* ctx = nullptr;
  std::string error;
  cad_status_t status = CAD_STATUS_OK;

  Stack(Rank* rank, bool lend, const char* config = kConfig) {
    cad_host_options_v1_t options{};
    options.struct_size = sizeof(options);
    options.config_json = config;
    options.search_path = CAD_TEST_PLUGIN_DIR;
    options.bootstrap_rank = rank->rank;
    options.bootstrap_world_size = rank->world->size;
    if (lend) {
      options.host_all_to_all_v = lent_all_to_all_v;
      options.host_all_gather = lent_all_gather;
      options.host_barrier = lent_barrier;
      options.collectives_user = rank;
    }
    char message[1024] = {0};
    status = cad_host_create(&options, &host, message, sizeof message);
    error = message;
    if (status != CAD_STATUS_OK) return;
    const void* table = nullptr;
    status = cad_host_find_instance(host, "comm", CAD_PLUGIN_KIND_COMMUNICATOR, &table, &ctx);
    comm = static_cast<const cad_communicator_v1_t*>(table);
  }
  ~Stack() { cad_host_destroy(host); }
  std::string last_error() const { return comm->last_error(ctx); }
};

// Runs body(rank) on `n` threads.
void run_ranks(int n, const std::function<void(Rank&)>& body) {
  World world(n);
  std::vector<Rank> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(Rank{&world, r});
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { body(ranks[r]); });
  for (auto& t : threads) t.join();
}

TEST(HostCommunicator, RefusedWhenTheHostLendsNoCollectives) {
  World world(1);
  Rank rank{&world, 0};
  Stack stack(&rank, /*lend=*/false);
  EXPECT_EQ(stack.status, CAD_STATUS_UNSUPPORTED);
  EXPECT_NE(stack.error.find("lends no collectives"), std::string::npos) << stack.error;
  EXPECT_NE(stack.error.find("'mpi'"), std::string::npos) << stack.error;
}

TEST(HostCommunicator, HostRefusesHalfLentCollectives) {
  cad_host_options_v1_t options{};
  options.struct_size = sizeof(options);
  options.config_json = kConfig;
  options.host_all_gather = lent_all_gather;
  options.bootstrap_world_size = 1;
  cad_host_t* host = nullptr;
  char message[512] = {0};
  EXPECT_EQ(cad_host_create(&options, &host, message, sizeof message), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(message).find("lend all or none"), std::string::npos) << message;
  EXPECT_EQ(host, nullptr);
}

TEST(HostCommunicator, ThreeRanksExchangeUnevenMessages) {
  constexpr int n = 3;
  run_ranks(n, [&](Rank& r) {
    Stack s(&r, true);
    ASSERT_EQ(s.status, CAD_STATUS_OK) << s.error;
    int32_t rank = -1, world = -1;
    cad_device_v1_t device{};
    EXPECT_EQ(s.comm->get_rank(s.ctx, &rank), CAD_STATUS_OK);
    EXPECT_EQ(s.comm->get_world_size(s.ctx, &world), CAD_STATUS_OK);
    EXPECT_EQ(s.comm->get_device(s.ctx, &device), CAD_STATUS_OK);
    EXPECT_EQ(rank, r.rank);
    EXPECT_EQ(world, n);
    EXPECT_EQ(device.device_type, CAD_DEVICE_CPU);
    // From src to dst: (src * 7 + dst * 3) % 5 bytes (zero for some pairs), with a gap of 2 bytes after each.
    auto size = [](int src, int dst) { return static_cast<uint64_t>((src * 7 + dst * 3) % 5); };
    std::vector<uint64_t> sc(n), sd(n), rc(n), rd(n);
    uint64_t at = 0, rat = 0;
    for (int p = 0; p < n; ++p) {
      sc[p] = size(r.rank, p);
      sd[p] = at;
      at += sc[p] + 2;
      rc[p] = size(p, r.rank);
      rd[p] = rat;
      rat += rc[p] + 2;
    }
    std::vector<uint8_t> send(at), recv(rat, 0xEE);
    for (int p = 0; p < n; ++p) {
      for (uint64_t i = 0; i < sc[p]; ++i) send[sd[p] + i] = static_cast<uint8_t>(r.rank * 50 + p * 10 + i);
    }
    ASSERT_EQ(s.comm->all_to_all_v(s.ctx, send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), nullptr),
              CAD_STATUS_OK)
        << s.last_error();
    for (int p = 0; p < n; ++p) {
      for (uint64_t i = 0; i < rc[p]; ++i) EXPECT_EQ(recv[rd[p] + i], static_cast<uint8_t>(p * 50 + r.rank * 10 + i));
      EXPECT_EQ(recv[rd[p] + rc[p]], 0xEE) << "gap after the block from rank " << p << " was written";
    }
    int32_t mine = 100 + r.rank, all[n] = {0, 0, 0};
    ASSERT_EQ(s.comm->all_gather(s.ctx, &mine, sizeof mine, all, nullptr), CAD_STATUS_OK) << s.last_error();
    for (int p = 0; p < n; ++p) EXPECT_EQ(all[p], 100 + p);
    EXPECT_EQ(s.comm->barrier(s.ctx, nullptr), CAD_STATUS_OK) << s.last_error();
    int dummy = 0;
    EXPECT_EQ(s.comm->barrier(s.ctx, &dummy), CAD_STATUS_INVALID_ARGUMENT);  // CPU only: stream must be NULL
    EXPECT_NE(s.last_error().find("stream must be NULL"), std::string::npos);
  });
}

TEST(HostCommunicator, MismatchedCountsAreRefusedOnEveryRankAlike) {
  constexpr int n = 2;
  std::vector<std::string> messages(n);
  run_ranks(n, [&](Rank& r) {
    Stack s(&r, true);
    ASSERT_EQ(s.status, CAD_STATUS_OK) << s.error;
    // Rank 0 sends 16 bytes to rank 1, which expects 8.
    std::vector<uint64_t> sc = {4, r.rank == 0 ? 16u : 4u}, sd = {0, 16}, rc = {4, 4}, rd = {0, 8};
    if (r.rank == 1) rc = {8, 4};
    std::vector<uint8_t> send(64), recv(64, 0xEE);
    EXPECT_EQ(s.comm->all_to_all_v(s.ctx, send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), nullptr),
              CAD_STATUS_COMMUNICATION);
    messages[r.rank] = s.last_error();
    EXPECT_EQ(recv[0], 0xEE) << "no payload may move after a refusal";
    // The instance stays usable after a refusal.
    EXPECT_EQ(s.comm->barrier(s.ctx, nullptr), CAD_STATUS_OK) << s.last_error();
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_NE(messages[0].find("rank 0 sends 16 bytes to rank 1, which expects 8"), std::string::npos) << messages[0];
}

TEST(HostCommunicator, AbsentPeerTimesOutAndLeavesTheInstanceUnusable) {
  constexpr int n = 2;
  run_ranks(n, [&](Rank& r) {
    Stack s(&r, true, R"({"instances": [{"name": "comm", "plugin": "host", "config": {"timeout_ms": 300}}]})");
    ASSERT_EQ(s.status, CAD_STATUS_OK) << s.error;
    if (r.rank == 1) return;  // never joins
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(s.comm->barrier(s.ctx, nullptr), CAD_STATUS_TIMEOUT);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_NE(s.last_error().find("test barrier: a peer did not arrive in time"), std::string::npos) << s.last_error();
    EXPECT_EQ(s.comm->barrier(s.ctx, nullptr), CAD_STATUS_COMMUNICATION);
    EXPECT_NE(s.last_error().find("unusable after an earlier failure"), std::string::npos) << s.last_error();
  });
}

}  // namespace
