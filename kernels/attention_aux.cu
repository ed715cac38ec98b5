// attention_aux.cu -- the small memory-bound kernels around the attention kernels: merging split-KV
// partial results, writing rows no segment covers, the backward's Delta = rowsum(dO * O), and the
// fp32 -> bf16 conversion of gradient accumulators.
#include <cuda_bf16.h>

#include <cmath>

#include "attention_internal.h"

namespace cad::kernels::detail {
namespace {

// One block per (combine item, head); one warp per query row at a time. Flash-decoding merge:
// LSE = log(sum_s exp(LSE_s)), O = sum_s exp(LSE_s - LSE) * O_s.
__global__ void fwd_combine_kernel(FwdParams p, const CombineItem* combines, int head_dim) {
  const CombineItem c = combines[blockIdx.x];
  const int head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int num_warps = blockDim.x / 32;
  const int64_t q_stride = static_cast<int64_t>(p.hq) * head_dim;
  for (int r = warp; r < c.q_rows; r += num_warps) {
    float lse_max = -INFINITY;
    for (int s = 0; s < c.num_slots; ++s) {
      const int64_t base = (static_cast<int64_t>(c.first_slot + s) * p.hq + head) * p.block_m + r;
      lse_max = fmaxf(lse_max, p.partial_lse[base]);
    }
    float total = 0.f;
    if (lse_max != -INFINITY) {
      for (int s = 0; s < c.num_slots; ++s) {
        const int64_t base = (static_cast<int64_t>(c.first_slot + s) * p.hq + head) * p.block_m + r;
        total += expf(p.partial_lse[base] - lse_max);
      }
    }
    const float lse = total > 0.f ? lse_max + logf(total) : -INFINITY;
    __nv_bfloat16* out = p.o + (c.q_row + r) * q_stride + static_cast<int64_t>(head) * head_dim;
    for (int d = lane; d < head_dim; d += 32) {
      float acc = 0.f;
      if (total > 0.f) {
        for (int s = 0; s < c.num_slots; ++s) {
          const int64_t base = (static_cast<int64_t>(c.first_slot + s) * p.hq + head) * p.block_m + r;
          const float w = expf(p.partial_lse[base] - lse);
          acc += w * p.partial_o[base * head_dim + d];
        }
      }
      out[d] = __float2bfloat16(acc);
    }
    if (lane == 0) p.lse[static_cast<int64_t>(head) * p.tq + c.q_row + r] = lse;
  }
}

// One block per uncovered row range: O rows to 0, LSE rows to -inf for every head.
__global__ void fill_uncovered_kernel(const RowRange* ranges, __nv_bfloat16* o, float* lse, int64_t tq, int hq,
                                      int head_dim) {
  const RowRange range = ranges[blockIdx.x];
  const int64_t row_elems = static_cast<int64_t>(hq) * head_dim;
  const int64_t n = (range.end - range.begin) * row_elems;
  __nv_bfloat16* out = o + range.begin * row_elems;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = __float2bfloat16(0.f);
  const int64_t rows = range.end - range.begin;
  for (int64_t i = threadIdx.x; i < rows * hq; i += blockDim.x) {
    const int64_t h = i / rows, r = i % rows;
    lse[h * tq + range.begin + r] = -INFINITY;
  }
}

// Delta[h, row] = sum_d dO[row, h, d] * O[row, h, d]; one warp per (row, head). The same pass copies the
// row's LSE in base-2 units beside it: the sm_90a backward loads both per query tile by TMA (16-byte
// aligned workspace, any start row), which the caller's LSE tensor need not allow.
__global__ void bwd_preprocess_kernel(const __nv_bfloat16* o, const __nv_bfloat16* d_o, const float* lse, float* delta,
                                      float* lse_log2, int64_t tq, int hq, int head_dim) {
  const int64_t pair = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (pair >= tq * hq) return;
  const int64_t row = pair / hq;
  const int h = static_cast<int>(pair % hq);
  const int64_t base = pair * head_dim;  // [row, h, :] is contiguous
  float acc = 0.f;
  for (int d = 2 * lane; d < head_dim; d += 64) {
    const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(o + base + d);
    const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(d_o + base + d);
    acc += __bfloat162float(a.x) * __bfloat162float(b.x) + __bfloat162float(a.y) * __bfloat162float(b.y);
  }
  for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (lane == 0) {
    const int64_t at = static_cast<int64_t>(h) * tq + row;
    delta[at] = acc;
    lse_log2[at] = lse[at] * kLog2e;
  }
}

__global__ void f32_to_bf16_kernel(const float4* src, __nv_bfloat162* dst, int64_t n4, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    dst[2 * i] = __floats2bfloat162_rn(v.x * scale, v.y * scale);
    dst[2 * i + 1] = __floats2bfloat162_rn(v.z * scale, v.w * scale);
  }
}

int grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<int>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

cudaError_t launch_fwd_combine(const FwdParams& p, const CombineItem* combines, int num_combines, int head_dim,
                               cudaStream_t stream) {
  if (num_combines == 0 || p.hq == 0) return cudaSuccess;
  fwd_combine_kernel<<<dim3(num_combines, p.hq), 256, 0, stream>>>(p, combines, head_dim);
  return cudaGetLastError();
}

cudaError_t launch_fill_uncovered(const RowRange* ranges, int num_ranges, __nv_bfloat16* o, float* lse, int64_t tq,
                                  int hq, int head_dim, cudaStream_t stream) {
  if (num_ranges == 0) return cudaSuccess;
  fill_uncovered_kernel<<<num_ranges, 256, 0, stream>>>(ranges, o, lse, tq, hq, head_dim);
  return cudaGetLastError();
}

cudaError_t launch_bwd_preprocess(const __nv_bfloat16* o, const __nv_bfloat16* d_o, const float* lse, float* delta,
                                  float* lse_log2, int64_t tq, int hq, int head_dim, cudaStream_t stream) {
  const int64_t threads = tq * hq * 32;
  if (threads == 0) return cudaSuccess;
  const int64_t blocks = (threads + 255) / 256;
  bwd_preprocess_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(o, d_o, lse, delta, lse_log2, tq, hq,
                                                                           head_dim);
  return cudaGetLastError();
}

// numel must be a multiple of 4 (every tensor here is [T, H, D] with D a multiple of 16).
cudaError_t launch_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t numel, float scale, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  const int64_t n4 = numel / 4;
  f32_to_bf16_kernel<<<grid_for(n4, 256), 256, 0, stream>>>(reinterpret_cast<const float4*>(src),
                                                          reinterpret_cast<__nv_bfloat162*>(dst), n4, scale);
  return cudaGetLastError();
}

}  // namespace cad::kernels::detail
