// communicator_conformance.cpp -- the conformance runner for communicator plugins.
//
// Collective: every rank of the job (e.g. `mpirun -np 4 cad conformance cad_mpi.so`) runs this with
// the same options and drives the plugin through its ABI alone -- the runner never calls MPI or
// NCCL itself. Every rank makes the same sequence of collective calls whatever its local results;
// after each check the ranks agree on the outcome (an all_gather of pass flags over the instance
// under test), so every rank records the same verdicts, and a run stops early (instead of hanging
// on the next call) once the instance is no longer usable on some rank.
//
// Buffers live where get_device says: host memory for CPU communicators, device memory (through
// the kit's CUDA bridge, legacy default stream, synchronised after every call) for CUDA ones.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "conformance.h"
#include "cuda_bridge.h"
#include "kit_internal.h"

namespace cad::conformance {
namespace {

using Bytes = std::vector<uint8_t>;

// ---- buffers on the communicator's device -------------------------------------------------------

class Buffer {
 public:
  Buffer(cad_device_v1_t device, size_t bytes) : device_(device), bytes_(bytes) {
    if (device_.device_type == CAD_DEVICE_CUDA) {
      data_ = cuda::allocate(device_.device_id, bytes, &error_);
    } else {
      host_.resize(bytes);
      data_ = host_.data();
    }
  }
  ~Buffer() {
    if (device_.device_type == CAD_DEVICE_CUDA) cuda::release(data_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  void* data() { return bytes_ == 0 ? nullptr : data_; }

  bool upload(const Bytes& from) {
    if (device_.device_type != CAD_DEVICE_CUDA) {
      std::copy(from.begin(), from.end(), host_.begin());
      return true;
    }
    return from.empty() || cuda::copy_to_device(data_, from.data(), from.size(), &error_);
  }
  bool download(Bytes* to) {
    to->resize(bytes_);
    if (device_.device_type != CAD_DEVICE_CUDA) {
      std::copy(host_.begin(), host_.end(), to->begin());
      return true;
    }
    return bytes_ == 0 || cuda::copy_to_host(to->data(), data_, bytes_, &error_);
  }

 private:
  cad_device_v1_t device_;
  size_t bytes_;
  void* data_ = nullptr;
  Bytes host_;
  std::string error_;
};

// ---- deterministic data -------------------------------------------------------------------------

uint64_t mix(uint64_t x) {  // splitmix64: the same numbers on every rank from the same inputs
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t draw(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) { return mix(mix(mix(seed ^ a) ^ b) ^ c); }

// Byte i of the message from rank `from` to rank `to` in case `tag`.
uint8_t payload_byte(uint64_t tag, int from, int to, uint64_t i) {
  return static_cast<uint8_t>((i * 131 + static_cast<uint64_t>(from) * 71 + static_cast<uint64_t>(to) * 37 + tag * 13) ^
                              (i >> 8));
}
constexpr uint8_t kUntouched = 0xA5;  // fills receive gaps, which must keep it
constexpr cad_status_t kStaysAway = -1;  // the status a rank that skips a provoked failure reports

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

// ---- the driver ---------------------------------------------------------------------------------

class Runner {
 public:
  Runner(const cad_plugin_v1_t* plugin, const Options& options, Report& report)
      : plugin_(plugin), comm_(plugin->communicator), options_(options), report_(report) {}

  void run();

 private:
  struct Case {  // one all_to_all_v: counts[from][to] bytes, in a layout with gaps
    std::string name;
    std::vector<std::vector<uint64_t>> counts;
  };

  bool setup();
  // Agrees on a check's outcome across ranks and records it. Returns false when the agreement
  // itself failed (the instance is unusable somewhere): the run must stop.
  bool settle(const std::string& name, bool ok, const std::string& detail, const std::string& pass_detail = "");
  cad_status_t finish_call(cad_status_t status, void* ctx);
  bool check_rank_world();
  bool check_barrier();
  bool check_all_gather(uint64_t bytes, const std::string& name);
  bool check_all_to_all(const Case& c, uint64_t tag);
  bool check_stream_refused();
  void check_failure(const std::string& name, const std::string& what, int64_t timeout_ms,
                     const std::function<cad_status_t(void* ctx)>& call, bool rank_takes_part,
                     bool may_go_undetected);
  std::string config_with_timeout(int64_t timeout_ms) const;
  std::string last_error() const;
  Case uneven_case(int round) const;

  const cad_plugin_v1_t* plugin_;
  const cad_communicator_v1_t* comm_;
  const Options& options_;
  Report& report_;
  TestServices services_;
  std::unique_ptr<Instance> instance_;
  void* ctx_ = nullptr;
  int rank_ = -1, world_ = 0;
  cad_device_v1_t device_{CAD_DEVICE_CPU, 0};
};

bool Runner::setup() {
  services_.add_instances(options_.instances);
  instance_ = create_for_run(plugin_, options_, services_, "communicator.create", report_);
  if (!instance_) return false;
  ctx_ = instance_->get();
  if (comm_->get_device(ctx_, &device_) != CAD_STATUS_OK ||
      (device_.device_type != CAD_DEVICE_CPU && device_.device_type != CAD_DEVICE_CUDA)) {
    report_.fail("communicator.device", "get_device failed or named neither CPU nor CUDA: " + last_error());
    return false;
  }
  if (device_.device_type == CAD_DEVICE_CUDA && !cuda::built_with_cuda()) {
    report_.skip("communicator", "a CUDA communicator, but this kit was built without CUDA");
    return false;
  }
  report_.pass("communicator.device", device_.device_type == CAD_DEVICE_CUDA
                                          ? "CUDA device " + std::to_string(device_.device_id)
                                          : std::string("CPU"));
  int32_t rank = -1, world = -1;
  const bool ok = comm_->get_rank(ctx_, &rank) == CAD_STATUS_OK &&
                  comm_->get_world_size(ctx_, &world) == CAD_STATUS_OK && world >= 1 && rank >= 0 && rank < world;
  if (!report_.expect(ok, "communicator.rank_world.local",
                      "get_rank/get_world_size gave rank " + std::to_string(rank) + " of " +
                          std::to_string(world) + ": " + last_error())) {
    return false;
  }
  rank_ = rank;
  world_ = world;
  return true;
}

std::string Runner::last_error() const {
  const char* message = comm_->last_error(ctx_);
  return message == nullptr ? "<NULL>" : message;
}

// CUDA communicators only enqueue: wait, so that errors and results are visible now.
cad_status_t Runner::finish_call(cad_status_t status, void*) {
  if (status == CAD_STATUS_OK && device_.device_type == CAD_DEVICE_CUDA) {
    std::string error;
    if (!cuda::synchronize(&error)) return CAD_STATUS_DEVICE_ERROR;
  }
  return status;
}

bool Runner::settle(const std::string& name, bool ok, const std::string& detail, const std::string& pass_detail) {
  Buffer mine(device_, 1), all(device_, static_cast<size_t>(world_));
  Bytes flags;
  const bool gathered = mine.ok() && all.ok() && mine.upload(Bytes{static_cast<uint8_t>(ok ? 1 : 0)}) &&
                        finish_call(comm_->all_gather(ctx_, mine.data(), 1, all.data(), nullptr), ctx_) ==
                            CAD_STATUS_OK &&
                        all.download(&flags);
  if (!gathered) {
    report_.fail(name, (ok ? std::string("passed here") : detail) +
                           "; then agreeing on the outcome (all_gather of pass flags) failed: " + last_error() +
                           "; the remaining checks were not run");
    return false;
  }
  std::vector<int> failed;
  for (int r = 0; r < world_; ++r) {
    if (flags[static_cast<size_t>(r)] != 1) failed.push_back(r);
  }
  if (failed.empty()) {
    report_.pass(name, pass_detail);
  } else {
    report_.fail(name, "failed on rank(s) " + rank_list(failed) + (ok ? "" : "; on this rank (" +
                                                                            std::to_string(rank_) + "): " + detail));
  }
  return true;
}

bool Runner::check_rank_world() {
  Buffer mine(device_, 8), all(device_, 8 * static_cast<size_t>(world_));
  Bytes sent(8), got;
  const int32_t values[2] = {rank_, world_};
  std::memcpy(sent.data(), values, 8);
  const bool moved = mine.upload(sent) &&
                     finish_call(comm_->all_gather(ctx_, mine.data(), 8, all.data(), nullptr), ctx_) == CAD_STATUS_OK &&
                     all.download(&got);
  std::string detail = moved ? "" : "all_gather failed: " + last_error() + mine.error() + all.error();
  for (int r = 0; moved && r < world_ && detail.empty(); ++r) {
    int32_t theirs[2];
    std::memcpy(theirs, got.data() + 8 * r, 8);
    if (theirs[0] != r || theirs[1] != world_) {
      detail = "position " + std::to_string(r) + " of the all_gather holds rank " + std::to_string(theirs[0]) +
               " of world " + std::to_string(theirs[1]) + " (ranks must be distinct, world sizes equal)";
    }
  }
  return settle("communicator.rank_world", detail.empty(), detail, "world size " + std::to_string(world_));
}

bool Runner::check_barrier() {
  std::string detail;
  for (int i = 0; i < 3 && detail.empty(); ++i) {
    if (finish_call(comm_->barrier(ctx_, nullptr), ctx_) != CAD_STATUS_OK) detail = "barrier failed: " + last_error();
  }
  return settle("communicator.barrier", detail.empty(), detail);
}

bool Runner::check_all_gather(uint64_t bytes, const std::string& name) {
  const uint64_t tag = 1000 + bytes;
  Bytes sent(bytes), got;
  for (uint64_t i = 0; i < bytes; ++i) sent[i] = payload_byte(tag, rank_, 0, i);
  Buffer mine(device_, bytes), all(device_, bytes * static_cast<uint64_t>(world_));
  std::string detail;
  if (!mine.ok() || !all.ok() || !mine.upload(sent)) {
    detail = "buffer set-up failed: " + mine.error() + all.error();
  } else if (finish_call(comm_->all_gather(ctx_, mine.data(), bytes, all.data(), nullptr), ctx_) != CAD_STATUS_OK) {
    detail = "all_gather of " + std::to_string(bytes) + " bytes failed: " + last_error();
  } else if (!all.download(&got)) {
    detail = "download failed: " + all.error();
  }
  for (int r = 0; detail.empty() && r < world_; ++r) {
    for (uint64_t i = 0; i < bytes; ++i) {
      if (got[static_cast<uint64_t>(r) * bytes + i] != payload_byte(tag, r, 0, i)) {
        detail = "byte " + std::to_string(i) + " of rank " + std::to_string(r) + "'s block is wrong";
        break;
      }
    }
  }
  return settle(name, detail.empty(), detail);
}

// Lays out the case (this rank's row and column, with gaps and peers in reverse order so that layout
// bugs show), runs it and compares every received byte, gaps included.
bool Runner::check_all_to_all(const Case& c, uint64_t tag) {
  const size_t w = static_cast<size_t>(world_);
  std::vector<uint64_t> send_counts(w), send_displs(w), recv_counts(w), recv_displs(w);
  uint64_t send_total = 0, recv_total = 0;
  for (size_t k = w; k-- > 0;) {
    send_counts[k] = c.counts[static_cast<size_t>(rank_)][k];
    recv_counts[k] = c.counts[k][static_cast<size_t>(rank_)];
    send_displs[k] = send_total + 3;
    send_total += send_counts[k] + 3;
    recv_displs[k] = recv_total + 5;
    recv_total += recv_counts[k] + 5;
  }
  Bytes send(send_total, 0), expected(recv_total, kUntouched), got;
  for (size_t p = 0; p < w; ++p) {
    for (uint64_t i = 0; i < send_counts[p]; ++i) send[send_displs[p] + i] = payload_byte(tag, rank_, static_cast<int>(p), i);
    for (uint64_t i = 0; i < recv_counts[p]; ++i) expected[recv_displs[p] + i] = payload_byte(tag, static_cast<int>(p), rank_, i);
  }
  Buffer send_buffer(device_, send_total), recv_buffer(device_, recv_total);
  std::string detail;
  const auto start = std::chrono::steady_clock::now();
  if (!send_buffer.ok() || !recv_buffer.ok() || !send_buffer.upload(send) ||
      !recv_buffer.upload(Bytes(recv_total, kUntouched))) {
    detail = "buffer set-up failed: " + send_buffer.error() + recv_buffer.error();
  } else if (finish_call(comm_->all_to_all_v(ctx_, send_buffer.data(), send_counts.data(), send_displs.data(),
                                             recv_buffer.data(), recv_counts.data(), recv_displs.data(), nullptr),
                         ctx_) != CAD_STATUS_OK) {
    detail = "all_to_all_v failed: " + last_error();
  } else if (!recv_buffer.download(&got)) {
    detail = "download failed: " + recv_buffer.error();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t p = 0; detail.empty() && p < w; ++p) {
    const uint64_t begin = recv_displs[p] - 5, end = recv_displs[p] + recv_counts[p];
    for (uint64_t i = begin; i < end; ++i) {
      if (got[i] != expected[i]) {
        detail = i < recv_displs[p] ? "the gap before rank " + std::to_string(p) + "'s block was written"
                                    : "byte " + std::to_string(i - recv_displs[p]) + " received from rank " +
                                          std::to_string(p) + " is wrong";
        break;
      }
    }
  }
  char timing[96];
  std::snprintf(timing, sizeof(timing), "%llu bytes out of this rank in %.3f s",
                static_cast<unsigned long long>(send_total - 3 * w), seconds);
  return settle(c.name, detail.empty(), detail, timing);
}

Runner::Case Runner::uneven_case(int round) const {
  Case c{"communicator.all_to_all_v.uneven." + std::to_string(round), {}};
  const uint64_t max_bytes = options_.quick ? 3000 : 200000;
  c.counts.assign(static_cast<size_t>(world_), std::vector<uint64_t>(static_cast<size_t>(world_), 0));
  for (int s = 0; s < world_; ++s) {
    for (int d = 0; d < world_; ++d) {
      const uint64_t r = draw(options_.seed, static_cast<uint64_t>(round), static_cast<uint64_t>(s),
                              static_cast<uint64_t>(d));
      // About one pair in four sends nothing; the rest send 1 .. max_bytes bytes.
      c.counts[static_cast<size_t>(s)][static_cast<size_t>(d)] = (r % 4 == 0) ? 0 : 1 + (r >> 8) % max_bytes;
    }
  }
  return c;
}

bool Runner::check_stream_refused() {
  if (device_.device_type != CAD_DEVICE_CPU) return true;
  int not_a_stream = 0;
  const cad_status_t status = comm_->barrier(ctx_, &not_a_stream);
  const std::string message = last_error();
  const bool ok = status != CAD_STATUS_OK && !message.empty() && message.find("stream") != std::string::npos;
  return settle("communicator.cpu_refuses_stream", ok,
                "barrier with a non-NULL stream on a CPU communicator returned " + status_name(status) +
                    " with message '" + message + "' (expected an error naming 'stream')");
}

std::string Runner::config_with_timeout(int64_t timeout_ms) const {
  nlohmann::json config = nlohmann::json::parse(options_.config_json, nullptr, false);
  if (!config.is_object()) config = nlohmann::json::object();
  config["timeout_ms"] = timeout_ms;
  return config.dump();
}

// A provoked failure on a separate, short-timeout instance: `call` must return an error (or its
// next call must, for communicators that only enqueue) on every rank that takes part -- either
// CAD_STATUS_COMMUNICATION or CAD_STATUS_TIMEOUT -- with a message, the same status everywhere.
// If `may_go_undetected` and every rank returned OK, the failure went unnoticed consistently, which
// the ABI allows where the transport cannot detect it: recorded as a skip saying so.
void Runner::check_failure(const std::string& name, const std::string& what, int64_t timeout_ms,
                           const std::function<cad_status_t(void* ctx)>& call, bool rank_takes_part,
                           bool may_go_undetected) {
  Lifecycle life;
  lifecycle_of(plugin_, &life);
  char message[512] = {0};
  void* ctx = nullptr;
  const std::string config = config_with_timeout(timeout_ms);
  cad_status_t status = life.create(services_.table(), config.c_str(), &ctx, message, sizeof(message));
  std::string detail, outcome;
  if (status != CAD_STATUS_OK) {
    detail = "create with " + config + " failed: " + message;
  } else if (rank_takes_part) {
    status = finish_call(call(ctx), ctx);
    // A stream communicator may report the failure only at its next call.
    if (status == CAD_STATUS_OK) status = finish_call(comm_->barrier(ctx, nullptr), ctx);
    const std::string error = last_error_of(life, ctx);
    outcome = status_name(status) + ": " + error.substr(0, 300);
    if (status != CAD_STATUS_COMMUNICATION && status != CAD_STATUS_TIMEOUT) {
      detail = what + " returned " + status_name(status) + " (expected COMMUNICATION or TIMEOUT): " + error;
    } else if (error.empty() || error == "<NULL>") {
      detail = what + " returned " + status_name(status) + " without a message";
    }
  } else {
    status = kStaysAway;
    outcome = "this rank stayed away";
  }
  if (ctx != nullptr) life.destroy(ctx);

  // What every rank got, gathered over the instance under test.
  std::vector<cad_status_t> statuses;
  Buffer mine(device_, 4), all(device_, 4 * static_cast<size_t>(world_));
  Bytes sent(4), got;
  std::memcpy(sent.data(), &status, 4);
  if (!mine.upload(sent) ||
      finish_call(comm_->all_gather(ctx_, mine.data(), 4, all.data(), nullptr), ctx_) != CAD_STATUS_OK ||
      !all.download(&got)) {
    report_.fail(name, "gathering every rank's status failed: " + last_error());
    return;
  }
  std::string seen;
  bool same = true, all_ok = true;
  cad_status_t first = kStaysAway;
  for (int r = 0; r < world_; ++r) {
    cad_status_t theirs;
    std::memcpy(&theirs, got.data() + 4 * r, 4);
    if (theirs == kStaysAway) continue;
    if (first == kStaysAway) first = theirs;
    same = same && theirs == first;
    all_ok = all_ok && theirs == CAD_STATUS_OK;
    seen += " rank " + std::to_string(r) + ": " + status_name(theirs) + ";";
  }
  if (all_ok && may_go_undetected) {
    // The ABI asks for detection only "where the transport can detect it".
    report_.skip(name, "not detected: every rank returned OK (allowed where the transport cannot detect it)");
    return;
  }
  if (!settle(name, detail.empty(), detail, outcome)) return;
  report_.expect(same, name + ".same_status_everywhere", "the ranks disagree:" + seen);
}

void Runner::run() {
  if (comm_ == nullptr) {
    report_.fail("communicator.table", "the plugin's kind is communicator but its communicator table is NULL");
    return;
  }
  if (!setup() || !check_rank_world() || !check_barrier()) return;
  if (!check_all_gather(1, "communicator.all_gather.1_byte") || !check_all_gather(0, "communicator.all_gather.0_bytes") ||
      !check_all_gather(4099, "communicator.all_gather.4099_bytes")) {
    return;
  }
  const size_t w = static_cast<size_t>(world_);
  Case zero{"communicator.all_to_all_v.all_zero", std::vector<std::vector<uint64_t>>(w, std::vector<uint64_t>(w, 0))};
  Case self{"communicator.all_to_all_v.self_only", zero.counts};
  for (size_t r = 0; r < w; ++r) self.counts[r][r] = 777 + r;
  Case ring{"communicator.all_to_all_v.ring_with_zeros", zero.counts};  // to the next rank only
  for (size_t r = 0; r < w; ++r) ring.counts[r][(r + 1) % w] = 1000 + 10 * r;
  if (!check_all_to_all(zero, 1) || !check_all_to_all(self, 2) || !check_all_to_all(ring, 3)) return;
  const int rounds = options_.quick ? 2 : 6;
  for (int round = 0; round < rounds; ++round) {
    if (!check_all_to_all(uneven_case(round), 10 + static_cast<uint64_t>(round))) return;
  }
  if (options_.quick) {
    report_.skip("communicator.all_to_all_v.large", "--quick");
  } else {
    // 64 MiB per message, at most 512 MiB out of each rank.
    const uint64_t per_peer = std::min<uint64_t>(64ull << 20, (512ull << 20) / w);
    Case large{"communicator.all_to_all_v.large", std::vector<std::vector<uint64_t>>(w, std::vector<uint64_t>(w, per_peer))};
    if (!check_all_to_all(large, 4)) return;
  }
  if (!check_stream_refused()) return;

  // Mismatch: rank 0 sends 16 bytes to the last rank, which expects 8; all other pairs agree.
  // (Buffers outlive the call: a stream communicator may still use them until the check synchronises.)
  const int last = world_ - 1;
  std::vector<uint64_t> send_counts(w, 8), recv_counts(w, 8), displs(w);
  for (size_t p = 0; p < w; ++p) displs[p] = 16 * p;
  if (rank_ == 0) send_counts[static_cast<size_t>(last)] = 16;
  Buffer send(device_, 16 * w), recv(device_, 16 * w);
  check_failure("communicator.mismatched_counts", "all_to_all_v with mismatched counts", 5000,
                [&](void* ctx) {
                  return comm_->all_to_all_v(ctx, send.data(), send_counts.data(), displs.data(), recv.data(),
                                             recv_counts.data(), displs.data(), nullptr);
                },
                /*rank_takes_part=*/true, /*may_go_undetected=*/true);
  if (world_ >= 2) {
    // The last rank skips a barrier: the others must come back with TIMEOUT (or COMMUNICATION).
    check_failure("communicator.rank_skips_barrier", "barrier while one rank stays away", 1500,
                  [&](void* ctx) { return comm_->barrier(ctx, nullptr); }, rank_ != last,
                  /*may_go_undetected=*/false);
  }
  // The instance under test is still usable after the provoked failures on the other instances.
  check_barrier();
}

}  // namespace

void run_communicator_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report) {
  Runner(plugin, options, report).run();
}

}  // namespace cad::conformance
