// test_services.cpp -- the host services a conformance run lends the plugin under test: stderr
// logging, allocation with leak accounting, and a registry of helper instances for lookup_plugin.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "conformance.h"
#include "cuda_bridge.h"

namespace cad::conformance {

namespace {

constexpr size_t kAlignment = 256;  // what cad_host_services_v1_t::allocate promises

struct Allocation {
  size_t bytes;
  cad_device_v1_t device;
};

struct Registered {
  const void* table;
  void* instance;
};

const char* level_name(cad_log_level_t level) {
  switch (level) {
    case CAD_LOG_TRACE: return "trace";
    case CAD_LOG_DEBUG: return "debug";
    case CAD_LOG_INFO: return "info";
    case CAD_LOG_WARN: return "warn";
    case CAD_LOG_ERROR: return "error";
    default: return "log";
  }
}

}  // namespace

struct TestServices::State {
  std::mutex mutex;
  std::map<void*, Allocation> allocations;
  int64_t outstanding = 0;
  std::map<std::tuple<std::string, cad_plugin_kind_t>, Registered> instances;
};

namespace {

TestServices::State* state_of(void* host_ctx) { return static_cast<TestServices::State*>(host_ctx); }

void log_to_stderr(void*, cad_log_level_t level, const char* source, const char* message) {
  std::fprintf(stderr, "[%s] %s: %s\n", level_name(level), source ? source : "(null)", message ? message : "(null)");
}

// Every service refuses a NULL host_ctx as the host's own services do (host_services.cpp): the plugin
// under test may pass anything, and the kit must report it, not crash in its own code.
cad_status_t allocate(void* host_ctx, cad_device_v1_t device, size_t bytes, void*, void** out) {
  if (host_ctx == nullptr || out == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  if (bytes == 0) {
    *out = nullptr;
    return CAD_STATUS_OK;
  }
  void* ptr = nullptr;
  if (device.device_type == CAD_DEVICE_CPU) {
    // Rounding SIZE_MAX up wraps to 0, and aligned_alloc(0) returned a 0-byte block with OK.
    if (bytes > SIZE_MAX - kAlignment) return CAD_STATUS_OUT_OF_MEMORY;
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    ptr = std::aligned_alloc(kAlignment, rounded);
    if (ptr == nullptr) return CAD_STATUS_OUT_OF_MEMORY;
  } else if (device.device_type == CAD_DEVICE_CUDA) {
    if (!cuda::built_with_cuda()) return CAD_STATUS_UNSUPPORTED;
    std::string error;
    ptr = cuda::allocate(device.device_id, bytes, &error);
    if (ptr == nullptr) return CAD_STATUS_OUT_OF_MEMORY;
  } else {
    return CAD_STATUS_UNSUPPORTED;
  }
  TestServices::State* state = state_of(host_ctx);
  std::lock_guard<std::mutex> lock(state->mutex);
  state->allocations[ptr] = Allocation{bytes, device};
  state->outstanding += static_cast<int64_t>(bytes);
  *out = ptr;
  return CAD_STATUS_OK;
}

void release(void* host_ctx, cad_device_v1_t device, void* ptr, void*) {
  if (ptr == nullptr) return;
  if (host_ctx == nullptr) {
    std::fprintf(stderr, "[error] test services: free with a NULL host_ctx; ignored\n");
    return;
  }
  TestServices::State* state = state_of(host_ctx);
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    auto it = state->allocations.find(ptr);
    if (it == state->allocations.end()) {
      // Not ours (double free or foreign pointer): count nothing, free nothing, say so.
      std::fprintf(stderr, "[error] test services: free of a pointer it did not allocate\n");
      return;
    }
    if (it->second.device.device_type != device.device_type) {
      std::fprintf(stderr, "[error] test services: free with a different device than allocate\n");
    }
    device = it->second.device;
    state->outstanding -= static_cast<int64_t>(it->second.bytes);
    state->allocations.erase(it);
  }
  if (device.device_type == CAD_DEVICE_CUDA) {
    cuda::release(ptr);
  } else {
    std::free(ptr);
  }
}

cad_status_t lookup(void* host_ctx, const char* name, cad_plugin_kind_t kind, const void** out_table,
                    void** out_instance) {
  if (host_ctx == nullptr || name == nullptr || out_table == nullptr || out_instance == nullptr) {
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  TestServices::State* state = state_of(host_ctx);
  std::lock_guard<std::mutex> lock(state->mutex);
  auto it = state->instances.find({name, kind});
  if (it == state->instances.end()) return CAD_STATUS_NOT_FOUND;
  *out_table = it->second.table;
  *out_instance = it->second.instance;
  return CAD_STATUS_OK;
}

// ABI v1.1 host collectives for a world of one rank, in process: what a host like the Python package
// lends (torch.distributed) reduced to the one rank the kit is, so that a communicator forwarding to
// lent collectives (plugin "host") can be checked here instead of failing create with UNSUPPORTED.
void write_error(char* error, size_t capacity, const std::string& text) {
  if (error == nullptr || capacity == 0) return;
  std::snprintf(error, capacity, "%s", text.c_str());
}

cad_status_t one_rank_all_to_all_v(void*, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                                   void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, int64_t,
                                   char* error, size_t error_capacity) {
  if (send_counts == nullptr || send_displs == nullptr || recv_counts == nullptr || recv_displs == nullptr) {
    write_error(error, error_capacity, "kit's one-rank all_to_all_v: NULL count or displacement array");
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  if (send_counts[0] != recv_counts[0]) {
    write_error(error, error_capacity, "kit's one-rank all_to_all_v: rank 0 sends " + std::to_string(send_counts[0]) +
                                           " bytes to itself but expects " + std::to_string(recv_counts[0]));
    return CAD_STATUS_COMMUNICATION;
  }
  if (send_counts[0] == 0) return CAD_STATUS_OK;
  if (send == nullptr || recv == nullptr) {
    write_error(error, error_capacity, "kit's one-rank all_to_all_v: NULL buffer with a non-zero count");
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  std::memmove(static_cast<char*>(recv) + recv_displs[0], static_cast<const char*>(send) + send_displs[0],
               send_counts[0]);
  return CAD_STATUS_OK;
}

cad_status_t one_rank_all_gather(void*, const void* send, uint64_t bytes, void* recv, int64_t, char* error,
                                 size_t error_capacity) {
  if (bytes == 0) return CAD_STATUS_OK;
  if (send == nullptr || recv == nullptr) {
    write_error(error, error_capacity, "kit's one-rank all_gather: NULL buffer with a non-zero size");
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  std::memmove(recv, send, bytes);
  return CAD_STATUS_OK;
}

cad_status_t one_rank_barrier(void*, int64_t, char*, size_t) { return CAD_STATUS_OK; }

}  // namespace

TestServices::TestServices(cad_log_level_t level) : state_(new State), table_{} {
  table_.struct_size = sizeof(cad_host_services_v1_t);
  table_.abi_major = CAD_ABI_VERSION_MAJOR;
  table_.abi_minor = CAD_ABI_VERSION_MINOR;
  table_.host_ctx = state_;
  table_.log_level = level;
  table_.log = log_to_stderr;
  table_.allocate = allocate;
  table_.free = release;
  table_.lookup_plugin = lookup;
  table_.bootstrap_all_gather = nullptr;  // no bootstrap: an NCCL communicator bootstraps through MPI here
  // The lent collectives' world (ABI v1.1): this process alone.
  table_.bootstrap_rank = 0;
  table_.bootstrap_world_size = 1;
  table_.host_all_to_all_v = one_rank_all_to_all_v;
  table_.host_all_gather = one_rank_all_gather;
  table_.host_barrier = one_rank_barrier;
}

TestServices::~TestServices() {
  // Memory a plugin leaked is freed here so the kit itself stays clean under ASan; the leak was
  // already visible through outstanding_bytes().
  for (auto& [ptr, allocation] : state_->allocations) {
    if (allocation.device.device_type == CAD_DEVICE_CUDA) {
      cuda::release(ptr);
    } else {
      std::free(ptr);
    }
  }
  delete state_;
}

int64_t TestServices::outstanding_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->outstanding;
}

void TestServices::add_instance(const std::string& name, cad_plugin_kind_t kind, const void* table,
                                void* instance) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->instances[{name, kind}] = Registered{table, instance};
}

void TestServices::add_instances(const std::vector<HelperInstance>& instances) {
  for (const HelperInstance& h : instances) add_instance(h.name, h.kind, h.table, h.instance);
}

}  // namespace cad::conformance
