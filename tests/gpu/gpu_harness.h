// gpu_harness.h -- what the GPU tests share: loading a plugin .so through its entry symbol, a host
// services table that allocates CUDA memory in stream order, tensor descriptors, bf16 rounding and
// error measures. GPU-only: built when CAD_ENABLE_CUDA, run from tests/gpu/run_gpu_checks.sh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cad_plugin_v1.h"

namespace cad::gpu_test {

#define CAD_CHECK_CUDA(expr)                                                                  \
  do {                                                                                        \
    const cudaError_t e_ = (expr);                                                            \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(e_) << " " << cudaGetErrorString(e_); \
  } while (0)

// A loaded plugin (dlopen with local scope) and one attention instance of it.
class AttentionPlugin {
 public:
  explicit AttentionPlugin(const std::string& file, const char* config = "{}");
  ~AttentionPlugin();
  AttentionPlugin(const AttentionPlugin&) = delete;
  AttentionPlugin& operator=(const AttentionPlugin&) = delete;
  const cad_attention_v1_t* table() const { return table_; }
  void* ctx() const { return ctx_; }
  const std::string& error() const { return error_; }  // why loading or create failed, "" if it worked
  std::string last_error() const { return ctx_ ? table_->last_error(ctx_) : error_; }
  int64_t outstanding_device_bytes() const;

 private:
  void* handle_ = nullptr;
  const cad_attention_v1_t* table_ = nullptr;
  void* ctx_ = nullptr;
  std::string error_;
  cad_host_services_v1_t services_{};
};

std::string plugin_path(const std::string& name);  // $CAD_PLUGIN_DIR or the build's plugin folder

// A tensor descriptor with its own shape storage.
struct Tensor {
  std::vector<int64_t> shape;
  cad_tensor_v1_t t{};
  Tensor() = default;
  Tensor(void* data, cad_device_type_t device, cad_dtype_v1_t dtype, std::vector<int64_t> dims);
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
};
constexpr cad_dtype_v1_t kBf16{CAD_DTYPE_CODE_BFLOAT, 16, 1};
constexpr cad_dtype_v1_t kF32{CAD_DTYPE_CODE_FLOAT, 32, 1};

// Device buffer that frees itself.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// The tensors of one forward + backward, compact, all of one dtype except LSE (fp32): Q, O, dO, dQ
// [tq, hq, d]; K, V, dK, dV [tk, hkv, d]; LSE [hq, tq].
struct AttentionData {
  void *q, *k, *v, *o, *d_o, *d_q, *d_k, *d_v;
  float* lse;
};
struct AttentionShape {
  int64_t tq, tk;
  int hq, hkv, d;
  int64_t window_left = -1, window_right = -1;  // ABI v1.2 sliding window, passed when either is >= 0
};

// Forward, then backward on the forward's O and LSE, of an attention plugin through its ABI, with
// softmax scale 1/sqrt(d); `stream` is null for CPU tensors. Returns "" or what failed (the call and the
// plugin's message). Each call is followed by a synchronisation of the stream; *forward_ms and
// *backward_ms (when given) receive the host time of each call until then.
std::string run_attention(const AttentionPlugin& plugin, const std::vector<cad_segment_v1_t>& segments,
                          const AttentionShape& shape, bool causal, cad_device_type_t device, cad_dtype_v1_t dtype,
                          const AttentionData& x, cudaStream_t stream, double* forward_ms = nullptr,
                          double* backward_ms = nullptr);

uint16_t float_to_bf16(float x);
float bf16_to_float(uint16_t x);
// Random bf16 values in [-1, 1); `as_float` receives the same values exactly.
std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng, std::vector<float>* as_float);
std::vector<float> bf16_vector_to_float(const std::vector<uint16_t>& v);

// max |a - b| / max(max |b|, min_scale) (0 / 0 = 0); NaN anywhere gives +inf. min_scale > 0 turns the error
// absolute (in units of min_scale) where the reference is (nearly) all zeros.
double max_relative_error(const std::vector<float>& got, const std::vector<float>& want, double min_scale = 0);

}  // namespace cad::gpu_test
