// gpu_harness.cpp -- plugin loading, a stream-ordered CUDA allocator for the host services, bf16 helpers.
#include "gpu_harness.h"

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <unordered_map>

namespace cad::gpu_test {
namespace {

// Host services for the tests: stderr logging, cudaMallocAsync/cudaFreeAsync on the caller's stream
// for CUDA memory, malloc for CPU memory, and a count of bytes still allocated (leak check).
struct HostState {
  std::mutex mutex;
  std::unordered_map<void*, size_t> live;
  int64_t outstanding = 0;
};

void log_line(void*, cad_log_level_t level, const char* source, const char* message) {
  if (level >= CAD_LOG_WARN) std::fprintf(stderr, "[%s] %s\n", source, message);
}

cad_status_t allocate(void* host_ctx, cad_device_v1_t device, size_t bytes, void* stream, void** out) {
  auto* st = static_cast<HostState*>(host_ctx);
  *out = nullptr;
  if (bytes == 0) return CAD_STATUS_OK;
  if (device.device_type == CAD_DEVICE_CUDA) {
    if (cudaMallocAsync(out, bytes, static_cast<cudaStream_t>(stream)) != cudaSuccess) return CAD_STATUS_OUT_OF_MEMORY;
  } else {
    *out = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (*out == nullptr) return CAD_STATUS_OUT_OF_MEMORY;
  }
  std::lock_guard<std::mutex> lock(st->mutex);
  st->live[*out] = bytes;
  st->outstanding += static_cast<int64_t>(bytes);
  return CAD_STATUS_OK;
}

void release(void* host_ctx, cad_device_v1_t device, void* ptr, void* stream) {
  auto* st = static_cast<HostState*>(host_ctx);
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(st->mutex);
    auto it = st->live.find(ptr);
    if (it != st->live.end()) {
      st->outstanding -= static_cast<int64_t>(it->second);
      st->live.erase(it);
    }
  }
  if (device.device_type == CAD_DEVICE_CUDA) {
    cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
  } else {
    std::free(ptr);
  }
}

cad_status_t lookup(void*, const char*, cad_plugin_kind_t, const void**, void**) { return CAD_STATUS_NOT_FOUND; }

}  // namespace

std::string plugin_path(const std::string& name) {
  const char* dir = std::getenv("CAD_PLUGIN_DIR");
  return std::string(dir ? dir : CAD_TEST_PLUGIN_DIR) + "/cad_" + name + ".so";
}

AttentionPlugin::AttentionPlugin(const std::string& file, const char* config) {
  auto* state = new HostState();
  services_.struct_size = sizeof(services_);
  services_.abi_major = CAD_ABI_VERSION_MAJOR;
  services_.abi_minor = CAD_ABI_VERSION_MINOR;
  services_.host_ctx = state;
  services_.log_level = CAD_LOG_WARN;
  services_.log = log_line;
  services_.allocate = allocate;
  services_.free = release;
  services_.lookup_plugin = lookup;
  services_.bootstrap_all_gather = nullptr;
  services_.bootstrap_rank = -1;
  services_.bootstrap_world_size = 0;

  handle_ = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    error_ = std::string("dlopen: ") + dlerror();
    return;
  }
  auto entry = reinterpret_cast<cad_plugin_entry_v1_fn>(dlsym(handle_, CAD_PLUGIN_ENTRY_SYMBOL_V1));
  if (entry == nullptr || entry()->kind != CAD_PLUGIN_KIND_ATTENTION || entry()->attention == nullptr) {
    error_ = file + ": not an attention plugin";
    return;
  }
  table_ = entry()->attention;
  char message[512] = {0};
  if (table_->create(&services_, config, &ctx_, message, sizeof(message)) != CAD_STATUS_OK) {
    error_ = std::string("create: ") + message;
    ctx_ = nullptr;
  }
}

AttentionPlugin::~AttentionPlugin() {
  if (ctx_ != nullptr) table_->destroy(ctx_);
  // Plugins stay loaded: the CUDA runtime keeps per-module state until process exit.
  delete static_cast<HostState*>(services_.host_ctx);
}

int64_t AttentionPlugin::outstanding_device_bytes() const {
  auto* st = static_cast<HostState*>(services_.host_ctx);
  std::lock_guard<std::mutex> lock(st->mutex);
  return st->outstanding;
}

Tensor::Tensor(void* data, cad_device_type_t device, cad_dtype_v1_t dtype, std::vector<int64_t> dims)
    : shape(std::move(dims)) {
  t.data = data;
  t.device = {device, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0 && cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

std::string run_attention(const AttentionPlugin& plugin, const std::vector<cad_segment_v1_t>& segments,
                          const AttentionShape& s, bool causal, cad_device_type_t device, cad_dtype_v1_t dtype,
                          const AttentionData& x, cudaStream_t stream, double* forward_ms, double* backward_ms) {
  Tensor tq(x.q, device, dtype, {s.tq, s.hq, s.d}), tk(x.k, device, dtype, {s.tk, s.hkv, s.d}),
      tv(x.v, device, dtype, {s.tk, s.hkv, s.d}), to(x.o, device, dtype, {s.tq, s.hq, s.d}),
      tl(x.lse, device, kF32, {s.hq, s.tq}), tdo(x.d_o, device, dtype, {s.tq, s.hq, s.d}),
      tdq(x.d_q, device, dtype, {s.tq, s.hq, s.d}), tdk(x.d_k, device, dtype, {s.tk, s.hkv, s.d}),
      tdv(x.d_v, device, dtype, {s.tk, s.hkv, s.d});
  const float scale = 1.f / std::sqrt(static_cast<float>(s.d));
  using Clock = std::chrono::steady_clock;
  // Runs one call, then waits for the stream; "" or what failed.
  const auto timed = [&](const char* what, const auto& call, double* ms) -> std::string {
    const auto start = Clock::now();
    if (call() != CAD_STATUS_OK) return std::string(what) + ": " + plugin.last_error();
    if (stream != nullptr) {
      if (const cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
        return std::string(what) + ": " + cudaGetErrorName(e) + " " + cudaGetErrorString(e);
      }
    }
    if (ms != nullptr) *ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    return "";
  };

  cad_attention_forward_args_v1_t fa{};
  fa.struct_size = sizeof(fa);
  fa.segments = segments.data();
  fa.num_segments = static_cast<int64_t>(segments.size());
  fa.softmax_scale = scale;
  fa.causal = causal ? 1 : 0;
  fa.stream = stream;
  fa.q = &tq.t;
  fa.k = &tk.t;
  fa.v = &tv.t;
  fa.o = &to.t;
  fa.lse = &tl.t;
  if (s.window_left >= 0 || s.window_right >= 0) {
    fa.window_flags = CAD_WINDOW_GIVEN;
    fa.window_left = s.window_left;
    fa.window_right = s.window_right;
  }
  std::string failure = timed("forward", [&] { return plugin.table()->forward(plugin.ctx(), &fa); }, forward_ms);
  if (!failure.empty()) return failure;

  cad_attention_backward_args_v1_t ba{};
  ba.struct_size = sizeof(ba);
  ba.segments = fa.segments;
  ba.num_segments = fa.num_segments;
  ba.softmax_scale = scale;
  ba.causal = fa.causal;
  ba.stream = stream;
  ba.q = &tq.t;
  ba.k = &tk.t;
  ba.v = &tv.t;
  ba.o = &to.t;
  ba.lse = &tl.t;
  ba.d_o = &tdo.t;
  ba.d_q = &tdq.t;
  ba.d_k = &tdk.t;
  ba.d_v = &tdv.t;
  ba.window_flags = fa.window_flags;
  ba.window_left = fa.window_left;
  ba.window_right = fa.window_right;
  return timed("backward", [&] { return plugin.table()->backward(plugin.ctx(), &ba); }, backward_ms);
}

uint16_t float_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, std::vector<float>* as_float) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint16_t> out(n);
  if (as_float) as_float->resize(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = float_to_bf16(dist(rng));
    if (as_float) (*as_float)[i] = bf16_to_float(out[i]);
  }
  return out;
}

std::vector<float> bf16_vector_to_float(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_float(v[i]);
  return out;
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want, double min_scale) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return std::numeric_limits<double>::infinity();
    max_err = std::max(max_err, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  const double scale = std::max(max_ref, min_scale);
  if (scale == 0) return max_err == 0 ? 0 : std::numeric_limits<double>::infinity();
  return max_err / scale;
}

}  // namespace cad::gpu_test
