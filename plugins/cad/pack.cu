// pack.cu -- CAD's data movement kernels: many row-range copies in one launch (pack = gather token
// ranges into a send buffer, unpack = scatter them back) and the fixed-order sum of partial dK/dV
// buffers that several attention servers sent back for the same tokens.
#include <cuda_bf16.h>

#include <cstdint>

#include "pack.h"

namespace cad::kernels {
namespace {

// Every block walks every range; inside a range the blocks of the grid share the bytes, so one long
// range and many short ones both spread over the whole GPU. Rows [begin, end) of a [T, H, D] tensor
// are contiguous, so each range is one contiguous copy of num_rows * row_bytes bytes.
template <class Vec>
__global__ void copy_row_ranges_kernel(const char* src, char* dst, int64_t row_bytes, const RowCopy* copies,
                                       int64_t num_copies) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t c = 0; c < num_copies; ++c) {
    const RowCopy rc = copies[c];
    const Vec* s = reinterpret_cast<const Vec*>(src + rc.src_row * row_bytes);
    Vec* d = reinterpret_cast<Vec*>(dst + rc.dst_row * row_bytes);
    const int64_t n = rc.num_rows * row_bytes / static_cast<int64_t>(sizeof(Vec));
    for (int64_t i = first; i < n; i += stride) d[i] = s[i];
  }
}

// The same walk where a row's `row_bytes` are a slice of a longer row on either side (a head group's heads):
// the range is num_rows pieces, each thread takes (row, vector) pairs of it.
template <class Vec>
__global__ void copy_row_slices_kernel(const char* src, int64_t src_stride, char* dst, int64_t dst_stride,
                                       int64_t row_bytes, const RowCopy* copies, int64_t num_copies) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t per_row = row_bytes / static_cast<int64_t>(sizeof(Vec));
  for (int64_t c = 0; c < num_copies; ++c) {
    const RowCopy rc = copies[c];
    const int64_t n = rc.num_rows * per_row;
    for (int64_t i = first; i < n; i += stride) {
      const int64_t r = i / per_row, e = i % per_row;
      reinterpret_cast<Vec*>(dst + (rc.dst_row + r) * dst_stride)[e] =
          reinterpret_cast<const Vec*>(src + (rc.src_row + r) * src_stride)[e];
    }
  }
}

template <class In>
__device__ __forceinline__ float to_float(In x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

template <class T>
__global__ void sum_partials_kernel(const T* partials, int num_partials, int64_t partial_stride, int64_t numel, T* out,
                                    bool accumulate) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = accumulate ? to_float(out[i]) : 0.f;
    for (int p = 0; p < num_partials; ++p) acc += to_float(partials[p * partial_stride + i]);
    out[i] = from_float<T>(acc);
  }
}

// One block row per copy range would leave SMs idle on few long ranges: instead every block walks every
// range (as copy_row_ranges_kernel) and the (row, head) elements of a range are spread over the grid.
__global__ void copy_strided_rows_kernel(const float* src, int64_t src_rs, int64_t src_hs, float* dst, int64_t dst_rs,
                                         int64_t dst_hs, int64_t heads, const RowCopy* copies, int64_t num_copies) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t c = 0; c < num_copies; ++c) {
    const RowCopy rc = copies[c];
    const int64_t n = rc.num_rows * heads;
    // Consecutive threads take consecutive rows of one head: reads and writes of the [H, T] side coalesce.
    for (int64_t i = first; i < n; i += stride) {
      const int64_t h = i / rc.num_rows, r = i % rc.num_rows;
      dst[(rc.dst_row + r) * dst_rs + h * dst_hs] = src[(rc.src_row + r) * src_rs + h * src_hs];
    }
  }
}

// A block per output row (grid-stride over rows), its threads over the row's elements: every contribution
// row is read once, coalesced, and the sum is written once.
template <class T>
__global__ void sum_rows_kernel(const T* src, int64_t row_elems, const int64_t* first, const int64_t* src_rows,
                                const int64_t* owner_rows, int64_t num_rows, T* out, int64_t out_stride,
                                bool accumulate) {
  for (int64_t r = blockIdx.x; r < num_rows; r += gridDim.x) {
    const int64_t begin = first[r], end = first[r + 1];
    T* d = out + owner_rows[r] * out_stride;
    for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x) {
      float acc = accumulate ? to_float(d[e]) : 0.f;
      for (int64_t j = begin; j < end; ++j) acc += to_float(src[src_rows[j] * row_elems + e]);
      d[e] = from_float<T>(acc);
    }
  }
}

int grid_size(int64_t work, int threads) {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t want = (work + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(sms) * 8;
  return static_cast<int>(want < 1 ? 1 : (want < cap ? want : cap));
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

cudaError_t copy_row_slices(const void* src, int64_t src_row_stride, void* dst, int64_t dst_row_stride,
                            int64_t row_bytes, const RowCopy* copies, int64_t num_copies, cudaStream_t stream) {
  if (num_copies == 0 || row_bytes == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr || copies == nullptr || row_bytes < 0 || num_copies < 0 ||
      src_row_stride < row_bytes || dst_row_stride < row_bytes) {
    return cudaErrorInvalidValue;
  }
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  constexpr int kThreads = 256;
  const int blocks = grid_size(1 << 20, kThreads);
  // The widest access every row start allows: 16 bytes for any [T, H, D] bf16 tensor with H*D % 8 == 0.
  const auto fits = [&](int64_t bytes) {
    return row_bytes % bytes == 0 && src_row_stride % bytes == 0 && dst_row_stride % bytes == 0 &&
           aligned(src, bytes) && aligned(dst, bytes);
  };
  if (src_row_stride == row_bytes && dst_row_stride == row_bytes) {  // whole rows: each range is one block of bytes
    if (fits(16)) {
      copy_row_ranges_kernel<uint4><<<blocks, kThreads, 0, stream>>>(s, d, row_bytes, copies, num_copies);
    } else if (fits(4)) {
      copy_row_ranges_kernel<uint32_t><<<blocks, kThreads, 0, stream>>>(s, d, row_bytes, copies, num_copies);
    } else {
      copy_row_ranges_kernel<uint8_t><<<blocks, kThreads, 0, stream>>>(s, d, row_bytes, copies, num_copies);
    }
  } else if (fits(16)) {
    copy_row_slices_kernel<uint4><<<blocks, kThreads, 0, stream>>>(s, src_row_stride, d, dst_row_stride, row_bytes,
                                                                   copies, num_copies);
  } else if (fits(4)) {
    copy_row_slices_kernel<uint32_t><<<blocks, kThreads, 0, stream>>>(s, src_row_stride, d, dst_row_stride, row_bytes,
                                                                      copies, num_copies);
  } else {
    copy_row_slices_kernel<uint8_t><<<blocks, kThreads, 0, stream>>>(s, src_row_stride, d, dst_row_stride, row_bytes,
                                                                     copies, num_copies);
  }
  return cudaGetLastError();
}

cudaError_t copy_row_ranges(const void* src, void* dst, int64_t row_bytes, const RowCopy* copies, int64_t num_copies,
                            cudaStream_t stream) {
  return copy_row_slices(src, row_bytes, dst, row_bytes, row_bytes, copies, num_copies, stream);
}

cudaError_t copy_strided_rows_f32(const float* src, int64_t src_row_stride, int64_t src_head_stride, float* dst,
                                  int64_t dst_row_stride, int64_t dst_head_stride, int64_t heads,
                                  const RowCopy* copies, int64_t num_copies, cudaStream_t stream) {
  if (num_copies == 0 || heads == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr || copies == nullptr || num_copies < 0 || heads < 0) return cudaErrorInvalidValue;
  copy_strided_rows_kernel<<<grid_size(1 << 18, 256), 256, 0, stream>>>(src, src_row_stride, src_head_stride, dst,
                                                                         dst_row_stride, dst_head_stride, heads, copies,
                                                                         num_copies);
  return cudaGetLastError();
}

cudaError_t sum_rows(const void* src, bool bf16, int64_t row_elems, const int64_t* first, const int64_t* src_rows,
                     const int64_t* owner_rows, int64_t num_rows, void* out, cudaStream_t stream, bool accumulate,
                     int64_t out_row_stride) {
  if (num_rows == 0 || row_elems == 0) return cudaSuccess;
  if (out_row_stride == 0) out_row_stride = row_elems;
  if (src == nullptr || out == nullptr || first == nullptr || src_rows == nullptr || owner_rows == nullptr ||
      num_rows < 0 || row_elems < 0 || out_row_stride < row_elems) {
    return cudaErrorInvalidValue;
  }
  const int threads = row_elems >= 256 ? 256 : 128;
  const int blocks = grid_size(num_rows * threads, threads);
  if (bf16) {
    sum_rows_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), row_elems,
                                                                   first, src_rows, owner_rows, num_rows,
                                                                   static_cast<__nv_bfloat16*>(out), out_row_stride,
                                                                   accumulate);
  } else {
    sum_rows_kernel<float><<<blocks, threads, 0, stream>>>(static_cast<const float*>(src), row_elems, first, src_rows,
                                                           owner_rows, num_rows, static_cast<float*>(out), out_row_stride,
                                                           accumulate);
  }
  return cudaGetLastError();
}

cudaError_t sum_partials_bf16(const void* partials, int num_partials, int64_t partial_stride, int64_t numel,
                              void* out, bool accumulate, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  if (out == nullptr || (num_partials > 0 && partials == nullptr) || num_partials < 0) return cudaErrorInvalidValue;
  sum_partials_kernel<__nv_bfloat16><<<grid_size(numel, 256), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(partials), num_partials, partial_stride, numel,
      static_cast<__nv_bfloat16*>(out), accumulate);
  return cudaGetLastError();
}

cudaError_t sum_partials_f32(const float* partials, int num_partials, int64_t partial_stride, int64_t numel,
                             float* out, bool accumulate, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  if (out == nullptr || (num_partials > 0 && partials == nullptr) || num_partials < 0) return cudaErrorInvalidValue;
  sum_partials_kernel<float><<<grid_size(numel, 256), 256, 0, stream>>>(partials, num_partials, partial_stride, numel,
                                                                        out, accumulate);
  return cudaGetLastError();
}

}  // namespace cad::kernels
