// device_checks.cu -- see device_checks.h.
#include "device_checks.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace cad::gpu_test {
namespace {

#define CHECK_TRY(expr)               \
  do {                                \
    const cudaError_t e_ = (expr);    \
    if (e_ != cudaSuccess) return e_; \
  } while (0)

unsigned grid_for(int64_t n) { return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 4096))); }

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_random_kernel(uint16_t* out, int64_t n, uint64_t seed, float amplitude) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64(seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(i));
    const float unit = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1), 24 bits
    const __nv_bfloat16 value = __float2bfloat16_rn(amplitude * (2.0f * unit - 1.0f));
    out[i] = __bfloat16_as_ushort(value);
  }
}

__global__ void bf16_to_f32_kernel(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
  }
}

// Non-negative floats order like their bit patterns, so atomicMax on the bits is a float max.
struct Accumulator {
  unsigned int max_error_bits;
  unsigned int max_reference_bits;
  unsigned long long non_finite;
  unsigned long long wrong_exact;
  unsigned long long reference_bad;
};

__device__ void flush(Accumulator* acc, float max_error, float max_reference, unsigned long long non_finite,
                      unsigned long long wrong_exact, unsigned long long reference_bad) {
  for (int offset = 16; offset > 0; offset /= 2) {
    max_error = fmaxf(max_error, __shfl_xor_sync(0xffffffffu, max_error, offset));
    max_reference = fmaxf(max_reference, __shfl_xor_sync(0xffffffffu, max_reference, offset));
    non_finite += __shfl_xor_sync(0xffffffffu, non_finite, offset);
    wrong_exact += __shfl_xor_sync(0xffffffffu, wrong_exact, offset);
    reference_bad += __shfl_xor_sync(0xffffffffu, reference_bad, offset);
  }
  if (threadIdx.x % 32 != 0) return;
  atomicMax(&acc->max_error_bits, __float_as_uint(max_error));
  atomicMax(&acc->max_reference_bits, __float_as_uint(max_reference));
  if (non_finite) atomicAdd(&acc->non_finite, non_finite);
  if (wrong_exact) atomicAdd(&acc->wrong_exact, wrong_exact);
  if (reference_bad) atomicAdd(&acc->reference_bad, reference_bad);
}

// Every thread walks the whole grid-stride range (no early exit) so that the warp shuffles see all lanes.
__global__ void check_rows_kernel(const uint16_t* got_bf16, const float* got_f32, const float* ref, int64_t n,
                                  int64_t row_elems, const uint8_t* row_defined, Accumulator* acc) {
  float max_error = 0.f, max_reference = 0.f;
  unsigned long long non_finite = 0, wrong_exact = 0, reference_bad = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float got = got_bf16 != nullptr ? __uint_as_float(static_cast<uint32_t>(got_bf16[i]) << 16) : got_f32[i];
    const float want = ref[i];
    if (row_defined[i / row_elems] == 0) {
      wrong_exact += got != 0.f;
      reference_bad += want != 0.f;
    } else if (!isfinite(want)) {
      ++reference_bad;
    } else if (!isfinite(got)) {
      ++non_finite;
    } else {
      max_error = fmaxf(max_error, fabsf(got - want));
      max_reference = fmaxf(max_reference, fabsf(want));
    }
  }
  flush(acc, max_error, max_reference, non_finite, wrong_exact, reference_bad);
}

__global__ void check_lse_kernel(const float* got, const float* ref, int64_t n, int64_t rows, const uint8_t* row_defined,
                                 Accumulator* acc) {
  float max_error = 0.f;
  unsigned long long non_finite = 0, wrong_exact = 0, reference_bad = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = got[i], want = ref[i];
    const bool want_minus_inf = isinf(want) && want < 0.f;
    if (row_defined[i % rows] == 0) {
      wrong_exact += !(isinf(g) && g < 0.f);
      reference_bad += !want_minus_inf;
    } else if (want_minus_inf) {
      wrong_exact += !(isinf(g) && g < 0.f);
    } else if (!isfinite(want)) {
      ++reference_bad;
    } else if (!isfinite(g)) {
      ++non_finite;
    } else {
      max_error = fmaxf(max_error, fabsf(g - want) / fmaxf(1.f, fabsf(want)));
    }
  }
  flush(acc, max_error, 0.f, non_finite, wrong_exact, reference_bad);
}

template <class Launch>
cudaError_t run_check(Launch launch, cudaStream_t stream, TensorCheck* result) {
  Accumulator* acc = nullptr;
  CHECK_TRY(cudaMalloc(&acc, sizeof(Accumulator)));
  Accumulator host{};
  cudaError_t err = cudaMemsetAsync(acc, 0, sizeof(Accumulator), stream);
  if (err == cudaSuccess) err = launch(acc);
  if (err == cudaSuccess) err = cudaMemcpyAsync(&host, acc, sizeof(Accumulator), cudaMemcpyDeviceToHost, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaFree(acc);
  if (err != cudaSuccess) return err;
  if (synced != cudaSuccess) return synced;
  float max_error, max_reference;
  std::memcpy(&max_error, &host.max_error_bits, sizeof(float));
  std::memcpy(&max_reference, &host.max_reference_bits, sizeof(float));
  result->max_error = max_error;
  result->max_reference = max_reference;
  result->non_finite = static_cast<int64_t>(host.non_finite);
  result->wrong_exact = static_cast<int64_t>(host.wrong_exact);
  result->reference_bad = static_cast<int64_t>(host.reference_bad);
  return cudaSuccess;
}

}  // namespace

double TensorCheck::relative() const {
  if (max_reference == 0) return max_error == 0 ? 0 : INFINITY;
  return max_error / max_reference;
}

cudaError_t fill_random_bf16(uint16_t* out, int64_t n, uint64_t seed, float amplitude, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  fill_random_kernel<<<grid_for(n), 256, 0, stream>>>(out, n, seed, amplitude);
  return cudaGetLastError();
}

cudaError_t bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  bf16_to_f32_kernel<<<grid_for(n), 256, 0, stream>>>(in, out, n);
  return cudaGetLastError();
}

cudaError_t check_rows(const uint16_t* got_bf16, const float* got_f32, const float* ref, int64_t rows, int64_t row_elems,
                       const uint8_t* row_defined, cudaStream_t stream, TensorCheck* result) {
  *result = TensorCheck{};
  if ((got_bf16 == nullptr) == (got_f32 == nullptr) || row_elems <= 0 || rows < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t n = rows * row_elems;
  return run_check(
      [&](Accumulator* acc) {
        check_rows_kernel<<<grid_for(n), 256, 0, stream>>>(got_bf16, got_f32, ref, n, row_elems, row_defined, acc);
        return cudaGetLastError();
      },
      stream, result);
}

cudaError_t check_lse(const float* got, const float* ref, int64_t heads, int64_t rows, const uint8_t* row_defined,
                      cudaStream_t stream, TensorCheck* result) {
  *result = TensorCheck{};
  if (heads <= 0 || rows < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t n = heads * rows;
  return run_check(
      [&](Accumulator* acc) {
        check_lse_kernel<<<grid_for(n), 256, 0, stream>>>(got, ref, n, rows, row_defined, acc);
        return cudaGetLastError();
      },
      stream, result);
}

}  // namespace cad::gpu_test
