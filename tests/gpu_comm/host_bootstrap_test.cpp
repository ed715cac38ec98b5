// host_bootstrap_test.cpp -- the "nccl" communicator bootstrapped by its host: cad_host_create with
// cad_host_options_v1_t.bootstrap_all_gather / bootstrap_rank / bootstrap_world_size, the plugin
// configured with "bootstrap": "host" (or "auto"), on real GPUs. Not run by CI except --refusals-only.
//
//   cad_nccl_host_bootstrap_test PATH/cad_nccl.so [--ranks N] [--timeout-ms MS] [--refusals-only]
//                                [--only PHASE,...] [--verbose]
//   --ranks N       world size of the working phases (default: every visible GPU; at least 2)
//   --timeout-ms MS the host all-gather's deadline and the plugin's timeout_ms there (default 30000); a
//                   phase is killed after 3 * MS + 60 s
//   --refusals-only the phases that need no GPU (what ctest runs)
//   --verbose       also print the host's and the plugin's debug/info log lines
//
// The host's all-gather is shared memory between the ranks (an mmap'd buffer and a barrier with a
// deadline, so it can fail but never hang), usable by threads and by forked processes alike. Every
// phase runs in its own forked process group; this parent never touches CUDA or NCCL and kills a
// phase that outlives its limit. Phases:
//   refusals (no GPU needed; all that --refusals-only runs, as the CPU ctest does):
//     no_callback    "bootstrap": "host", no callback lent        -> INVALID_CONFIG naming bootstrap_all_gather
//     bad_rank       callback lent, rank 2 of world 2             -> INVALID_CONFIG, callback never called
//     bad_connect_peers  "connect_peers": "yes"                    -> INVALID_CONFIG naming the key
//   failures (one GPU):
//     callback_error the callback returns COMMUNICATION           -> create fails COMMUNICATION naming the
//                                                                    bootstrap and the callback
//     no_unique_id   rank 0's ncclGetUniqueId fails (NCCL_SOCKET_IFNAME names no interface), 2 ranks
//                    as threads                                    -> both fail at once; rank 1 is told
//                                                                    rank 0 sent no id (not left waiting)
//     no_fill        the callback returns OK but fills nothing    -> COMMUNICATION "received no NCCL unique id"
//   the real thing (N >= 2 GPUs, N = --ranks or every visible GPU; rank r on device r):
//     threads        N ranks as threads of one process, each with its own cad_host_t, config
//                    {"bootstrap": "host", "device": r, "timeout_ms": --timeout-ms}
//     processes      N ranks as forked processes, the same with "bootstrap": "auto" (which must pick
//                    the host's callback)
//     Each rank checks: create; get_rank/get_world_size/get_device; one callback call of 128 bytes (the
//     NCCL unique id); the plugin's log says "(bootstrap: host)"; two rounds of all_to_all_v with a
//     distinct byte pattern and size per (source, destination) pair (one empty, one of 3 MiB, gaps
//     between messages that must stay untouched) verified on the host; all_gather of 1 MiB + 3 bytes
//     verified; barrier, where the last rank arrives 500 ms late and every other rank must wait for it;
//     cad_host_destroy; no warning or error logged.
// Output: one line per check ("ok" / "FAIL"), "PHASE <name>: passed|FAILED|skipped", and last
// "host_bootstrap: P passed, F failed, S skipped". Exit status 0 only if no phase failed.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "cad/cad_host.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 64;
constexpr size_t kMaxBlock = 4096;        // largest block the test's all-gather carries
constexpr size_t kNcclUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES: what the plugin exchanges
constexpr int kPass = 0, kFail = 1, kSkip = 77;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- output: whole lines, flushed at once (threads and processes share stdout) ------------------
std::mutex g_print_mutex;
bool g_verbose = false;

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  char line[4096];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(line, sizeof line, fmt, args);
  va_end(args);
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::fputs(line, stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// One rank's (or one phase's) checks.
class Checks {
 public:
  explicit Checks(std::string who) : who_(std::move(who)) {}
  bool check(bool ok, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    char what[2048];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    say("  %-4s [%s] %s", ok ? "ok" : "FAIL", who_.c_str(), what);
    if (!ok) failed_ = true;
    return ok;
  }
  bool ok() const { return !failed_; }

 private:
  std::string who_;
  bool failed_ = false;
};

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

// ---- the host's bootstrap all-gather, over shared memory -----------------------------------------
// Lives in MAP_SHARED memory, so that it works between threads and between forked processes. Lock-free
// atomics are address-free, so they synchronise across processes too.
struct Exchange {
  std::atomic<uint32_t> arrived{0};
  std::atomic<uint32_t> generation{0};
  std::atomic<uint32_t> broken{0};  // a barrier timed out: every later wait fails at once
  int32_t world = 0;
  std::atomic<uint32_t> calls[kMaxRanks];
  std::atomic<uint64_t> bytes[kMaxRanks];
  unsigned char data[kMaxRanks * kMaxBlock];
};

Exchange* new_exchange(int world) {
  void* memory = mmap(nullptr, sizeof(Exchange), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    say("mmap of the shared exchange failed: %s", std::strerror(errno));
    std::exit(kFail);
  }
  auto* x = new (memory) Exchange();
  x->world = world;
  for (int r = 0; r < kMaxRanks; ++r) {
    x->calls[r].store(0);
    x->bytes[r].store(0);
  }
  return x;
}

// A reusable barrier with a deadline. False: it timed out (and the exchange is broken for good).
bool exchange_barrier(Exchange& x, Clock::time_point deadline) {
  if (x.broken.load() != 0) return false;
  const uint32_t generation = x.generation.load(std::memory_order_acquire);
  if (x.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(x.world)) {
    x.arrived.store(0, std::memory_order_relaxed);
    x.generation.fetch_add(1, std::memory_order_acq_rel);
    return true;
  }
  while (x.generation.load(std::memory_order_acquire) == generation) {
    if (x.broken.load() != 0 || Clock::now() >= deadline) {
      x.broken.store(1);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

enum class Behaviour { kGather, kFail, kNoFill };

// What one rank lends its host as bootstrap_user.
struct Member {
  Exchange* x = nullptr;
  int rank = 0;
  int64_t timeout_ms = 60000;
  Behaviour behaviour = Behaviour::kGather;
};

// cad_bootstrap_all_gather_fn: every rank's `bytes` bytes into `recv`, ordered by rank.
cad_status_t all_gather_callback(void* user, const void* send, size_t bytes, void* recv) {
  Member& m = *static_cast<Member*>(user);
  Exchange& x = *m.x;
  x.calls[m.rank].fetch_add(1);
  x.bytes[m.rank].store(bytes);
  if (m.behaviour == Behaviour::kFail) return CAD_STATUS_COMMUNICATION;
  if (m.behaviour == Behaviour::kNoFill) return CAD_STATUS_OK;
  if (bytes > kMaxBlock || (bytes > 0 && (send == nullptr || recv == nullptr))) {
    x.broken.store(1);  // the others must not wait for us
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(m.timeout_ms);
  std::memcpy(x.data + static_cast<size_t>(m.rank) * bytes, send, bytes);
  if (!exchange_barrier(x, deadline)) return CAD_STATUS_TIMEOUT;
  bool same_size = true;
  for (int r = 0; r < x.world; ++r) same_size = same_size && x.bytes[r].load() == bytes;
  if (same_size) std::memcpy(recv, x.data, static_cast<size_t>(x.world) * bytes);
  if (!exchange_barrier(x, deadline)) return CAD_STATUS_TIMEOUT;  // all have read before the next call
  return same_size ? CAD_STATUS_OK : CAD_STATUS_INVALID_ARGUMENT;
}

// ---- one rank's host -------------------------------------------------------------------------------
struct LogSink {
  std::mutex mutex;
  std::vector<std::pair<cad_log_level_t, std::string>> lines;
};

void log_callback(void* user, cad_log_level_t level, const char* source, const char* message) {
  auto& sink = *static_cast<LogSink*>(user);
  std::string line = std::string("[") + (source != nullptr ? source : "?") + "] " + (message != nullptr ? message : "");
  std::lock_guard<std::mutex> lock(sink.mutex);
  sink.lines.emplace_back(level, std::move(line));
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

struct RankSpec {
  std::string plugin;
  std::string comm_config;  // the nccl instance's config, JSON
  int rank = 0;
  int world = 1;
  bool lend_callback = true;
  Member member;
};

struct Created {
  cad_status_t status = CAD_STATUS_INTERNAL;
  std::string error;
  cad_host_t* host = nullptr;
  double seconds = 0;
};

Created create_host(RankSpec& spec, LogSink* sink) {
  const std::string stack = "{\"log_level\": \"debug\", \"instances\": [{\"name\": \"comm\", \"plugin\": " +
                            json_string(spec.plugin) + ", \"config\": " + spec.comm_config + "}]}";
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_json = stack.c_str();
  options.bootstrap_all_gather = spec.lend_callback ? &all_gather_callback : nullptr;
  options.bootstrap_user = &spec.member;
  options.bootstrap_rank = spec.rank;
  options.bootstrap_world_size = spec.world;
  options.log_callback = &log_callback;
  options.log_user = sink;
  char error[4096] = "";
  Created c;
  const auto t0 = Clock::now();
  c.status = cad_host_create(&options, &c.host, error, sizeof error);
  c.seconds = seconds_since(t0);
  c.error = error;
  return c;
}

// Lines at `level` or above (and all of them with --verbose) are printed; returns how many were at
// WARN or above.
int print_logs(LogSink& sink, const std::string& who) {
  std::lock_guard<std::mutex> lock(sink.mutex);
  int serious = 0;
  for (const auto& [level, line] : sink.lines) {
    if (level >= CAD_LOG_WARN) ++serious;
    if (level >= CAD_LOG_WARN || g_verbose) say("       [%s] log %s: %s", who.c_str(), level >= CAD_LOG_ERROR ? "ERROR" : level >= CAD_LOG_WARN ? "WARN" : level >= CAD_LOG_INFO ? "info" : "debug", line.c_str());
  }
  return serious;
}

bool logged(LogSink& sink, const char* part) {
  std::lock_guard<std::mutex> lock(sink.mutex);
  for (const auto& entry : sink.lines) {
    if (contains(entry.second, part)) return true;
  }
  return false;
}

// ---- data checks -----------------------------------------------------------------------------------
// Byte j of the message from `src` to `dst` in `round`: a hash, so that a misrouted or shifted byte is
// (almost always) wrong.
uint8_t pattern(uint32_t round, uint32_t src, uint32_t dst, uint64_t j) {
  uint64_t h = (static_cast<uint64_t>(round) << 56) ^ (static_cast<uint64_t>(src) << 48) ^
               (static_cast<uint64_t>(dst) << 40) ^ j;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return static_cast<uint8_t>(h);
}

// Bytes from `src` to `dst`: different for every pair, one empty message and one of 3 MiB.
uint64_t message_bytes(int src, int dst, int world) {
  if (src == 0 && dst == world - 1) return 0;
  if (src == world - 1 && dst == 0) return (3ull << 20) + 7;
  return 1 + 4096ull * static_cast<uint64_t>((src + 2 * dst) % 3) + 257ull * static_cast<uint64_t>(src) +
         131ull * static_cast<uint64_t>(dst);
}

constexpr uint8_t kSendGap = 0x5A, kRecvUntouched = 0xA5;

struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

bool cuda_check(Checks& c, cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  return c.check(false, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

struct Instance {
  const cad_communicator_v1_t* table = nullptr;
  void* ctx = nullptr;
};

bool check_all_to_all(Checks& c, const Instance& comm, int rank, int world, uint32_t round, cudaStream_t stream) {
  const auto n = static_cast<size_t>(world);
  std::vector<uint64_t> send_counts(n), send_displs(n), recv_counts(n), recv_displs(n);
  // Send messages in reverse rank order, receive in rank order, each followed by a gap.
  uint64_t send_bytes = 0, recv_bytes = 0;
  for (int d = world - 1; d >= 0; --d) {
    send_counts[static_cast<size_t>(d)] = message_bytes(rank, d, world);
    send_displs[static_cast<size_t>(d)] = send_bytes;
    send_bytes += send_counts[static_cast<size_t>(d)] + 64 + static_cast<uint64_t>(d);
  }
  for (int s = 0; s < world; ++s) {
    recv_counts[static_cast<size_t>(s)] = message_bytes(s, rank, world);
    recv_displs[static_cast<size_t>(s)] = recv_bytes;
    recv_bytes += recv_counts[static_cast<size_t>(s)] + 128 + 3 * static_cast<uint64_t>(s);
  }
  std::vector<uint8_t> host_send(send_bytes, kSendGap), host_recv(recv_bytes);
  for (int d = 0; d < world; ++d) {
    for (uint64_t j = 0; j < send_counts[static_cast<size_t>(d)]; ++j) {
      host_send[send_displs[static_cast<size_t>(d)] + j] =
          pattern(round, static_cast<uint32_t>(rank), static_cast<uint32_t>(d), j);
    }
  }
  DeviceBuffer send, recv;
  if (!cuda_check(c, cudaMalloc(&send.ptr, send_bytes), "cudaMalloc(send)") ||
      !cuda_check(c, cudaMalloc(&recv.ptr, recv_bytes), "cudaMalloc(recv)") ||
      !cuda_check(c, cudaMemcpy(send.ptr, host_send.data(), send_bytes, cudaMemcpyHostToDevice), "cudaMemcpy(send)") ||
      !cuda_check(c, cudaMemset(recv.ptr, kRecvUntouched, recv_bytes), "cudaMemset(recv)") ||
      !cuda_check(c, cudaDeviceSynchronize(), "cudaDeviceSynchronize")) {
    return false;
  }
  const cad_status_t status = comm.table->all_to_all_v(comm.ctx, send.ptr, send_counts.data(), send_displs.data(),
                                                       recv.ptr, recv_counts.data(), recv_displs.data(), stream);
  if (!c.check(status == CAD_STATUS_OK, "all_to_all_v round %u: %s %s", round, cad_status_name(status),
               status == CAD_STATUS_OK ? "" : comm.table->last_error(comm.ctx))) {
    return false;
  }
  if (!cuda_check(c, cudaStreamSynchronize(stream), "cudaStreamSynchronize after all_to_all_v") ||
      !cuda_check(c, cudaMemcpy(host_recv.data(), recv.ptr, recv_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(recv)")) {
    return false;
  }
  uint64_t wrong = 0, first = UINT64_MAX;
  int first_src = -1;
  uint8_t got = 0, expected = 0;
  for (int s = 0; s < world; ++s) {
    const uint64_t begin = recv_displs[static_cast<size_t>(s)], count = recv_counts[static_cast<size_t>(s)];
    const uint64_t end = s + 1 < world ? recv_displs[static_cast<size_t>(s) + 1] : recv_bytes;
    for (uint64_t i = begin; i < end; ++i) {
      const uint8_t want = i < begin + count
                               ? pattern(round, static_cast<uint32_t>(s), static_cast<uint32_t>(rank), i - begin)
                               : kRecvUntouched;
      if (host_recv[i] != want) {
        if (wrong++ == 0) {
          first = i;
          first_src = s;
          got = host_recv[i];
          expected = want;
        }
      }
    }
  }
  uint64_t sent_total = 0, received_total = 0;
  for (size_t p = 0; p < n; ++p) {
    sent_total += send_counts[p];
    received_total += recv_counts[p];
  }
  if (wrong == 0) {
    return c.check(true, "all_to_all_v round %u: %llu bytes sent, %llu received from %d ranks, every byte and gap "
                         "as expected", round, static_cast<unsigned long long>(sent_total),
                   static_cast<unsigned long long>(received_total), world);
  }
  return c.check(false, "all_to_all_v round %u: %llu wrong bytes; first at recv offset %llu (%s from rank %d): got "
                        "0x%02x, expected 0x%02x", round, static_cast<unsigned long long>(wrong),
                 static_cast<unsigned long long>(first),
                 first < recv_displs[static_cast<size_t>(first_src)] + recv_counts[static_cast<size_t>(first_src)]
                     ? "in the message" : "in the gap after the message",
                 first_src, got, expected);
}

bool check_all_gather(Checks& c, const Instance& comm, int rank, int world, cudaStream_t stream) {
  constexpr uint64_t kBytes = (1ull << 20) + 3, kGuard = 256;
  constexpr uint32_t kRound = 200, kTag = 250;
  const uint64_t total = kBytes * static_cast<uint64_t>(world);
  std::vector<uint8_t> host_send(kBytes), host_recv(total + kGuard);
  for (uint64_t j = 0; j < kBytes; ++j) host_send[j] = pattern(kRound, static_cast<uint32_t>(rank), kTag, j);
  DeviceBuffer send, recv;
  if (!cuda_check(c, cudaMalloc(&send.ptr, kBytes), "cudaMalloc(send)") ||
      !cuda_check(c, cudaMalloc(&recv.ptr, total + kGuard), "cudaMalloc(recv)") ||
      !cuda_check(c, cudaMemcpy(send.ptr, host_send.data(), kBytes, cudaMemcpyHostToDevice), "cudaMemcpy(send)") ||
      !cuda_check(c, cudaMemset(recv.ptr, kRecvUntouched, total + kGuard), "cudaMemset(recv)") ||
      !cuda_check(c, cudaDeviceSynchronize(), "cudaDeviceSynchronize")) {
    return false;
  }
  const cad_status_t status = comm.table->all_gather(comm.ctx, send.ptr, kBytes, recv.ptr, stream);
  if (!c.check(status == CAD_STATUS_OK, "all_gather: %s %s", cad_status_name(status),
               status == CAD_STATUS_OK ? "" : comm.table->last_error(comm.ctx))) {
    return false;
  }
  if (!cuda_check(c, cudaStreamSynchronize(stream), "cudaStreamSynchronize after all_gather") ||
      !cuda_check(c, cudaMemcpy(host_recv.data(), recv.ptr, total + kGuard, cudaMemcpyDeviceToHost), "cudaMemcpy(recv)")) {
    return false;
  }
  uint64_t wrong = 0, first = UINT64_MAX;
  for (uint64_t i = 0; i < total + kGuard; ++i) {
    const uint8_t want = i < total ? pattern(kRound, static_cast<uint32_t>(i / kBytes), kTag, i % kBytes) : kRecvUntouched;
    if (host_recv[i] != want && wrong++ == 0) first = i;
  }
  if (wrong == 0) {
    return c.check(true, "all_gather: %d blocks of %llu bytes, every byte as expected, guard untouched", world,
                   static_cast<unsigned long long>(kBytes));
  }
  return c.check(false, "all_gather: %llu wrong bytes; first at offset %llu (%s)", static_cast<unsigned long long>(wrong),
                 static_cast<unsigned long long>(first), first < total ? "in a block" : "in the guard after the blocks");
}

// The last rank reaches the barrier 500 ms after the others (who leave a host-side sync together);
// everyone else's barrier must not complete before it arrives.
bool check_barrier(Checks& c, const Instance& comm, Member& member, int rank, int world, cudaStream_t stream) {
  constexpr int kLateMs = 500;
  const bool late = rank == world - 1;
  if (!c.check(exchange_barrier(*member.x, Clock::now() + std::chrono::milliseconds(member.timeout_ms)),
               "host-side sync before the barrier check")) {
    return false;
  }
  const auto t0 = Clock::now();
  if (late) std::this_thread::sleep_for(std::chrono::milliseconds(kLateMs));
  const cad_status_t status = comm.table->barrier(comm.ctx, stream);
  if (!c.check(status == CAD_STATUS_OK, "barrier: %s %s", cad_status_name(status),
               status == CAD_STATUS_OK ? "" : comm.table->last_error(comm.ctx))) {
    return false;
  }
  if (!cuda_check(c, cudaStreamSynchronize(stream), "cudaStreamSynchronize after barrier")) return false;
  const double ms = seconds_since(t0) * 1e3;
  if (late) return c.check(true, "barrier: arrived %d ms late on purpose, done after %.0f ms", kLateMs, ms);
  return c.check(ms >= kLateMs * 0.8, "barrier: waited %.0f ms for the rank that came %d ms late (must be >= %d)", ms,
                 kLateMs, static_cast<int>(kLateMs * 0.8));
}

// One rank of a working world: rank r on device r. True if every check passed.
bool run_rank(RankSpec spec) {
  Checks c("rank " + std::to_string(spec.rank));
  const int device = spec.rank;
  if (!cuda_check(c, cudaSetDevice(device), "cudaSetDevice")) return false;
  LogSink sink;
  Created h = create_host(spec, &sink);
  const std::string who = "rank " + std::to_string(spec.rank);
  if (!c.check(h.status == CAD_STATUS_OK, "cad_host_create with bootstrap rank %d of %d, config %s: %s in %.2f s%s%s",
               spec.rank, spec.world, spec.comm_config.c_str(), cad_status_name(h.status), h.seconds,
               h.error.empty() ? "" : ": ", h.error.c_str())) {
    print_logs(sink, who);
    return false;
  }
  Instance comm;
  const void* table = nullptr;
  const cad_status_t found = cad_host_find_instance(h.host, "comm", CAD_PLUGIN_KIND_COMMUNICATOR, &table, &comm.ctx);
  comm.table = static_cast<const cad_communicator_v1_t*>(table);
  bool ok = c.check(found == CAD_STATUS_OK && comm.table != nullptr, "cad_host_find_instance('comm'): %s",
                    cad_status_name(found));
  if (ok) {
    int32_t rank = -1, world = -1;
    cad_device_v1_t dev{};
    const cad_status_t s1 = comm.table->get_rank(comm.ctx, &rank);
    const cad_status_t s2 = comm.table->get_world_size(comm.ctx, &world);
    const cad_status_t s3 = comm.table->get_device(comm.ctx, &dev);
    ok &= c.check(s1 == CAD_STATUS_OK && rank == spec.rank, "get_rank: %d (expected %d)", rank, spec.rank);
    ok &= c.check(s2 == CAD_STATUS_OK && world == spec.world, "get_world_size: %d (expected %d)", world, spec.world);
    ok &= c.check(s3 == CAD_STATUS_OK && dev.device_type == CAD_DEVICE_CUDA && dev.device_id == device,
                  "get_device: type %d id %d (expected CUDA %d)", static_cast<int>(dev.device_type), dev.device_id,
                  device);
    const uint32_t calls = spec.member.x->calls[spec.rank].load();
    const uint64_t bytes = spec.member.x->bytes[spec.rank].load();
    ok &= c.check(calls == 1 && bytes == kNcclUniqueIdBytes,
                  "the host's bootstrap_all_gather was called %u time(s) with %llu bytes (expected once, %zu: the "
                  "NCCL unique id)", calls, static_cast<unsigned long long>(bytes), kNcclUniqueIdBytes);
    if (cad_host_log_level(h.host) <= CAD_LOG_DEBUG) {
      ok &= c.check(logged(sink, "(bootstrap: host)"), "the plugin logged that it bootstrapped through the host");
    } else {
      say("  note [%s] log level above debug ($CAD_LOG_LEVEL?): the plugin's bootstrap line is not checked", who.c_str());
    }
    cudaStream_t stream = nullptr;
    if (cuda_check(c, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) {
      ok &= check_all_to_all(c, comm, spec.rank, spec.world, 1, stream);
      ok &= check_all_to_all(c, comm, spec.rank, spec.world, 2, stream);
      ok &= check_all_gather(c, comm, spec.rank, spec.world, stream);
      ok &= check_barrier(c, comm, spec.member, spec.rank, spec.world, stream);
      cudaStreamDestroy(stream);
    } else {
      ok = false;
    }
  }
  const auto t0 = Clock::now();
  cad_host_destroy(h.host);
  c.check(true, "cad_host_destroy in %.2f s", seconds_since(t0));
  const int serious = print_logs(sink, who);
  ok &= c.check(serious == 0, "%d warning/error line(s) logged by the host or the plugin", serious);
  return ok && c.ok();
}

// ---- phases ----------------------------------------------------------------------------------------
struct Options {
  std::string plugin;
  int ranks = 0;  // 0: every visible GPU
  int64_t timeout_ms = 30000;  // the test's all-gather and the plugin's timeout_ms in the working phases
  bool refusals_only = false;
  std::vector<std::string> only;
};

std::string config_for(const char* bootstrap, int device, int64_t timeout_ms = 0) {
  std::string config = std::string("{\"bootstrap\": \"") + bootstrap + "\", \"device\": " + std::to_string(device);
  if (timeout_ms > 0) config += ", \"timeout_ms\": " + std::to_string(timeout_ms);
  return config + "}";
}

// A create that must fail: checks status and the message's parts.
bool expect_refusal(Checks& c, const Created& h, cad_status_t want, std::initializer_list<const char*> parts) {
  bool has_parts = true;
  for (const char* part : parts) has_parts = has_parts && contains(h.error, part);
  const bool ok = h.status == want && h.host == nullptr && has_parts;
  c.check(ok, "create refused with %s (expected %s) in %.2f s: %s", cad_status_name(h.status), cad_status_name(want),
          h.seconds, h.error.c_str());
  if (!has_parts) {
    std::string list;
    for (const char* part : parts) list += std::string(list.empty() ? "" : ", ") + "'" + part + "'";
    c.check(false, "the message should contain %s", list.c_str());
  }
  if (h.host != nullptr) cad_host_destroy(h.host);
  return ok;
}

int phase_no_callback(const Options& o) {
  Checks c("no_callback");
  RankSpec spec;
  spec.plugin = o.plugin;
  spec.comm_config = config_for("host", 0);
  spec.world = 2;
  spec.lend_callback = false;
  spec.member.x = new_exchange(2);
  LogSink sink;
  const Created h = create_host(spec, &sink);
  const bool ok = expect_refusal(c, h, CAD_STATUS_INVALID_CONFIG, {"'comm'", "bootstrap", "\"host\"", "bootstrap_all_gather"});
  return ok ? kPass : kFail;
}

int phase_bad_rank(const Options& o) {
  Checks c("bad_rank");
  RankSpec spec;
  spec.plugin = o.plugin;
  spec.comm_config = config_for("host", 0);
  spec.rank = 2;
  spec.world = 2;
  spec.member.x = new_exchange(2);
  spec.member.rank = 0;  // where the callback would count its calls
  LogSink sink;
  const Created h = create_host(spec, &sink);
  bool ok = expect_refusal(c, h, CAD_STATUS_INVALID_CONFIG, {"bootstrap", "bootstrap_rank"});
  ok &= c.check(spec.member.x->calls[0].load() == 0, "the callback was not called (%u calls)", spec.member.x->calls[0].load());
  return ok ? kPass : kFail;
}

// connect_peers (create's one-byte exchange with every peer) is a boolean; a string is refused naming the key,
// before CUDA or the callback are touched.
int phase_bad_connect_peers(const Options& o) {
  Checks c("bad_connect_peers");
  RankSpec spec;
  spec.plugin = o.plugin;
  spec.comm_config = R"({"bootstrap": "host", "device": 0, "connect_peers": "yes"})";
  spec.world = 2;
  spec.member.x = new_exchange(2);
  spec.member.rank = 0;
  LogSink sink;
  const Created h = create_host(spec, &sink);
  bool ok = expect_refusal(c, h, CAD_STATUS_INVALID_CONFIG, {"connect_peers"});
  ok &= c.check(spec.member.x->calls[0].load() == 0, "the callback was not called (%u calls)", spec.member.x->calls[0].load());
  return ok ? kPass : kFail;
}

int phase_callback_error(const Options& o) {
  Checks c("callback_error");
  RankSpec spec;
  spec.plugin = o.plugin;
  spec.comm_config = config_for("host", 0);
  spec.rank = 0;
  spec.world = 2;
  spec.member.x = new_exchange(2);
  spec.member.behaviour = Behaviour::kFail;
  LogSink sink;
  const Created h = create_host(spec, &sink);
  bool ok = expect_refusal(c, h, CAD_STATUS_COMMUNICATION, {"'comm'", "bootstrap (host)", "bootstrap_all_gather failed"});
  ok &= c.check(spec.member.x->calls[0].load() == 1, "the callback was called once (%u)", spec.member.x->calls[0].load());
  // The host unloaded the plugin after the failed create while NCCL's bootstrap root thread (from rank
  // 0's ncclGetUniqueId) was still waiting: the process must survive that.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  c.check(true, "the process is still alive 1 s after the plugin was unloaded");
  return ok ? kPass : kFail;
}

int phase_no_unique_id(const Options& o) {
  // Read by NCCL when it first initialises (in this process: nothing here has called NCCL yet).
  setenv("NCCL_SOCKET_IFNAME", "cad_no_such_interface", 1);
  unsetenv("NCCL_COMM_ID");
  say("  note: NCCL_SOCKET_IFNAME=cad_no_such_interface in this phase; NCCL's \"no socket interface found\" "
      "warning is expected");
  Exchange* x = new_exchange(2);
  const int64_t wait_ms = 20000;
  std::vector<Created> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RankSpec spec;
      spec.plugin = o.plugin;
      spec.comm_config = config_for("host", 0);
      spec.rank = r;
      spec.world = 2;
      spec.member = Member{x, r, wait_ms, Behaviour::kGather};
      LogSink sink;
      cudaSetDevice(0);
      results[static_cast<size_t>(r)] = create_host(spec, &sink);
    });
  }
  for (auto& t : threads) t.join();
  Checks c0("no_unique_id rank 0"), c1("no_unique_id rank 1");
  bool ok = expect_refusal(c0, results[0], CAD_STATUS_COMMUNICATION, {"bootstrap (host)", "ncclGetUniqueId failed"});
  ok &= expect_refusal(c1, results[1], CAD_STATUS_COMMUNICATION, {"bootstrap (host)", "no NCCL unique id from rank 0"});
  ok &= c1.check(results[1].seconds < wait_ms / 2000.0,
                 "rank 1 was not left waiting in the all-gather for rank 0 (%.2f s; the callback gives up after %.0f s)",
                 results[1].seconds, wait_ms / 1000.0);
  ok &= c0.check(x->calls[0].load() == 1 && x->calls[1].load() == 1,
                 "both ranks joined the all-gather once (%u, %u)", x->calls[0].load(), x->calls[1].load());
  return ok ? kPass : kFail;
}

int phase_no_fill(const Options& o) {
  Checks c("no_fill");
  RankSpec spec;
  spec.plugin = o.plugin;
  spec.comm_config = config_for("host", 0);
  spec.rank = 0;
  spec.world = 1;
  spec.member.x = new_exchange(1);
  spec.member.behaviour = Behaviour::kNoFill;
  spec.member.timeout_ms = 5000;
  LogSink sink;
  const Created h = create_host(spec, &sink);
  const bool ok = expect_refusal(c, h, CAD_STATUS_COMMUNICATION, {"bootstrap (host)", "received no NCCL unique id"});
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  c.check(true, "the process is still alive 1 s after the plugin was unloaded");
  return ok ? kPass : kFail;
}

RankSpec world_rank(const Options& o, Exchange* x, int rank, int world, const char* bootstrap) {
  RankSpec spec;
  spec.plugin = o.plugin;
  spec.comm_config = config_for(bootstrap, rank, o.timeout_ms);
  spec.rank = rank;
  spec.world = world;
  spec.member = Member{x, rank, o.timeout_ms, Behaviour::kGather};
  return spec;
}

int phase_threads(const Options& o, int world) {
  Exchange* x = new_exchange(world);
  std::vector<int> ok(static_cast<size_t>(world), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { ok[static_cast<size_t>(r)] = run_rank(world_rank(o, x, r, world, "host")) ? 1 : 0; });
  }
  for (auto& t : threads) t.join();
  for (int v : ok) {
    if (v == 0) return kFail;
  }
  return kPass;
}

int phase_processes(const Options& o, int world) {
  Exchange* x = new_exchange(world);
  std::vector<pid_t> children;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const bool ok = run_rank(world_rank(o, x, r, world, "auto"));
      std::fflush(stdout);
      _exit(ok ? 0 : 1);
    }
    if (pid < 0) {
      say("fork failed: %s", std::strerror(errno));
      x->broken.store(1);
      break;
    }
    children.push_back(pid);
  }
  int result = static_cast<int>(children.size()) == world ? kPass : kFail;
  for (size_t i = 0; i < children.size(); ++i) {
    int status = 0;
    waitpid(children[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      say("  FAIL [rank %zu] process %s %d", i, WIFEXITED(status) ? "exited with status" : "killed by signal",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      result = kFail;
    }
  }
  return result;
}

// The process group of the phase running now: killed with us (timeout(1) sends SIGTERM to this
// process alone, and a phase's own group would outlive it holding the GPUs).
volatile sig_atomic_t g_phase_group = 0;

void on_termination(int sig) {
  if (g_phase_group != 0) kill(-g_phase_group, SIGKILL);
  signal(sig, SIG_DFL);
  raise(sig);
}

// Runs `body` in a forked process group, killed after `limit_s`.
struct Tally {
  int passed = 0, failed = 0, skipped = 0;
};

void run_phase(Tally& tally, const Options& o, const char* name, int limit_s, const std::function<int()>& body) {
  if (!o.only.empty()) {
    bool wanted = false;
    for (const auto& n : o.only) wanted = wanted || n == name;
    if (!wanted) return;
  }
  say("\n== phase %s", name);
  const auto t0 = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    const int rc = body();
    std::fflush(stdout);
    _exit(rc);
  }
  if (pid < 0) {
    say("PHASE %s: FAILED (fork: %s)", name, std::strerror(errno));
    ++tally.failed;
    return;
  }
  setpgid(pid, pid);
  g_phase_group = pid;
  int status = 0;
  bool killed = false;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (seconds_since(t0) > limit_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      killed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);  // anything the phase left behind
  g_phase_group = 0;
  const double s = seconds_since(t0);
  if (killed) {
    say("PHASE %s: FAILED (still running after %d s: killed; a hang)", name, limit_s);
    ++tally.failed;
  } else if (WIFSIGNALED(status)) {
    say("PHASE %s: FAILED (the phase process died of signal %d: %s, after %.1f s)", name, WTERMSIG(status),
        strsignal(WTERMSIG(status)), s);
    ++tally.failed;
  } else if (WEXITSTATUS(status) == kPass) {
    say("PHASE %s: passed (%.1f s)", name, s);
    ++tally.passed;
  } else if (WEXITSTATUS(status) == kSkip) {
    say("PHASE %s: skipped", name);
    ++tally.skipped;
  } else {
    say("PHASE %s: FAILED (%.1f s)", name, s);
    ++tally.failed;
  }
}

// The number of visible CUDA devices, asked in a child so that this process never initialises CUDA
// (forked children could not use it then).
int count_devices(std::string* why) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    char text[256];
    std::snprintf(text, sizeof text, "%d %s", e == cudaSuccess ? n : -1, e == cudaSuccess ? "" : cudaGetErrorString(e));
    if (write(fds[1], text, std::strlen(text)) < 0) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  char text[256] = "";
  ssize_t got = 0, r = 0;
  while ((r = read(fds[0], text + got, sizeof text - 1 - static_cast<size_t>(got))) > 0) got += r;
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  int n = -1;
  char* rest = nullptr;
  n = static_cast<int>(std::strtol(text, &rest, 10));
  if (rest == text) n = -1;
  if (why != nullptr) *why = rest != nullptr && *rest == ' ' ? rest + 1 : "";
  return n;
}

[[noreturn]] void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s PATH/cad_nccl.so [--ranks N] [--timeout-ms MS] [--refusals-only] [--only PHASE,...] "
               "[--verbose]\n",
               argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  signal(SIGTERM, on_termination);
  signal(SIGINT, on_termination);
  if (argc < 2 || argv[1][0] == '-') usage(argv[0]);
  Options o;
  o.plugin = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--ranks" && has_value) {
      o.ranks = std::atoi(argv[++i]);
    } else if (arg == "--timeout-ms" && has_value) {
      o.timeout_ms = std::atoll(argv[++i]);
      if (o.timeout_ms < 1000) usage(argv[0]);
    } else if (arg == "--refusals-only") {
      o.refusals_only = true;
    } else if (arg == "--only" && has_value) {
      std::string list = argv[++i];
      for (size_t start = 0; start <= list.size();) {
        const size_t comma = list.find(',', start);
        const size_t end = comma == std::string::npos ? list.size() : comma;
        if (end > start) o.only.push_back(list.substr(start, end - start));
        start = end + 1;
      }
    } else if (arg == "--verbose") {
      g_verbose = true;
    } else {
      usage(argv[0]);
    }
  }
  char resolved[PATH_MAX];
  if (realpath(o.plugin.c_str(), resolved) == nullptr) {
    std::fprintf(stderr, "%s: %s\n", o.plugin.c_str(), std::strerror(errno));
    return 2;
  }
  o.plugin = resolved;  // a path, never a plugin name to look up
  // NVLink multicast (NVLS) stays off on every multi-GPU run: on shared hosts it can take GPUs out of service.
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (nvls == nullptr || std::strcmp(nvls, "0") != 0) {
    if (nvls != nullptr) say("note: NCCL_NVLS_ENABLE=%s overridden with 0", nvls);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
  }
  say("host_bootstrap: plugin %s", o.plugin.c_str());

  Tally tally;
  run_phase(tally, o, "no_callback", 30, [&] { return phase_no_callback(o); });
  run_phase(tally, o, "bad_rank", 30, [&] { return phase_bad_rank(o); });
  run_phase(tally, o, "bad_connect_peers", 30, [&] { return phase_bad_connect_peers(o); });
  if (!o.refusals_only) {
    std::string why;
    const int devices = count_devices(&why);
    say("\nCUDA devices visible: %d%s%s", devices, why.empty() ? "" : " -- ", why.c_str());
    const int world = o.ranks > 0 ? o.ranks : devices;
    if (devices < 1) {
      say("PHASE gpu: FAILED (no CUDA device visible; the refusal phases above need none: --refusals-only)");
      ++tally.failed;
    } else {
      run_phase(tally, o, "callback_error", 60, [&] { return phase_callback_error(o); });
      run_phase(tally, o, "no_unique_id", 60, [&] { return phase_no_unique_id(o); });
      run_phase(tally, o, "no_fill", 60, [&] { return phase_no_fill(o); });
      const int limit_s = static_cast<int>(3 * o.timeout_ms / 1000) + 60;
      if (world < 2 || world > devices || world > kMaxRanks) {
        say("PHASE threads/processes: FAILED (need 2..%d ranks, one per GPU; have %d GPU(s), asked for %d ranks)",
            devices < kMaxRanks ? devices : kMaxRanks, devices, world);
        ++tally.failed;
      } else {
        say("\nworld: %d ranks, rank r on CUDA device r", world);
        run_phase(tally, o, "threads", limit_s, [&] { return phase_threads(o, world); });
        run_phase(tally, o, "processes", limit_s, [&] { return phase_processes(o, world); });
      }
    }
  }
  say("\nhost_bootstrap: %d passed, %d failed, %d skipped", tally.passed, tally.failed, tally.skipped);
  return tally.failed == 0 && tally.passed > 0 ? 0 : 1;
}
