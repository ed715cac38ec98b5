// attention_fwd.cuh -- the varlen attention forward kernel (FlashAttention-2 style) for one head
// dim, included by exactly one translation unit per head dim (fwd_hd64.cu, fwd_hd128.cu).
//
// One block = one work item (a tile of kFwdBlockM queries of one segment, one KV range) x one query
// head. Four warps, each owning 16 query rows; K/V tiles of kFwdBlockN keys stream through shared
// memory with cp.async double buffering; scores and the output accumulate in registers through
// mma.sync m16n8k16 (bf16 in, fp32 accumulate) with an online softmax in base 2.
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "attention_internal.h"
#include "common/tile_load.cuh"

namespace cad::kernels::detail {

template <int D>
struct FwdTraits {
  static constexpr int kBlockM = kFwdBlockM;
  static constexpr int kBlockN = kFwdBlockN;
  static constexpr int kWarps = kBlockM / 16;
  static constexpr int kThreads = kWarps * 32;
  // Q tile + two K tiles + two V tiles.
  static constexpr int kSmemBytes = (kBlockM * D + 4 * kBlockN * D) * 2;
};

template <int D>
__global__ void __launch_bounds__(FwdTraits<D>::kThreads) attention_fwd_kernel(FwdParams p) {
  using T = FwdTraits<D>;
  constexpr int BM = T::kBlockM, BN = T::kBlockN, NT = T::kThreads;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sK = sQ + BM * D;      // 2 buffers of BN x D
  __nv_bfloat16* sV = sK + 2 * BN * D;  // 2 buffers of BN x D

  const FwdItem item = p.items[blockIdx.x];
  const int head = blockIdx.y;
  const int kv_head = head / p.group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  const int64_t q_stride = static_cast<int64_t>(p.hq) * D;
  const int64_t kv_stride = static_cast<int64_t>(p.hq / p.group) * D;
  const __nv_bfloat16* gQ = p.q + item.q_row * q_stride + head * D;
  const __nv_bfloat16* gK = p.k + (item.kv_row + item.kv_begin) * kv_stride + kv_head * D;
  const __nv_bfloat16* gV = p.v + (item.kv_row + item.kv_begin) * kv_stride + kv_head * D;
  const int n_keys = item.kv_end - item.kv_begin;
  const int n_blocks = n_keys > 0 ? (n_keys + BN - 1) / BN : 0;

  load_tile_async<BM, D, NT>(sQ, gQ, q_stride, item.q_rows, tid);
  if (n_blocks > 0) {
    load_tile_async<BN, D, NT>(sK, gK, kv_stride, n_keys, tid);
    load_tile_async<BN, D, NT>(sV, gV, kv_stride, n_keys, tid);
  }
  cp_async_commit();

  float o_acc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o_acc[i][0] = o_acc[i][1] = o_acc[i][2] = o_acc[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // per-thread partial sums, reduced over the quad at the end
  uint32_t q_frag[D / 16][4];

  // Segment-relative index of this thread's two query rows.
  const int row0 = item.q_index + warp * 16 + g;
  const int warp_first_row = item.q_index + warp * 16;

  for (int j = 0; j < n_blocks; ++j) {
    if (j + 1 < n_blocks) {
      const int next = (j + 1) & 1;
      const int64_t off = static_cast<int64_t>(j + 1) * BN * kv_stride;
      load_tile_async<BN, D, NT>(sK + next * BN * D, gK + off, kv_stride, n_keys - (j + 1) * BN, tid);
      load_tile_async<BN, D, NT>(sV + next * BN * D, gV + off, kv_stride, n_keys - (j + 1) * BN, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        ldmatrix_x4(q_frag[kk], sQ + swizzled<D>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
      }
    }
    const __nv_bfloat16* k_tile = sK + (j & 1) * BN * D;
    const __nv_bfloat16* v_tile = sV + (j & 1) * BN * D;

    // S = Q K^T for this warp's 16 rows and BN keys.
    float s[BN / 8][4];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nn = 0; nn < BN / 16; ++nn) {
        uint32_t b[4];
        ldmatrix_x4(b, k_tile + swizzled<D>(nn * 16 + (lane & 7) + (lane >> 4) * 8, kk * 16 + ((lane >> 3) & 1) * 8));
        mma_bf16(s[2 * nn], q_frag[kk], b[0], b[1]);
        mma_bf16(s[2 * nn + 1], q_frag[kk], b[2], b[3]);
      }
    }

    // Scale into base-2 units, then mask keys past the range end and (causal) above the diagonal.
    const int key0 = item.kv_begin + j * BN;  // segment-relative key of column 0
    const bool need_mask =
        key0 + BN > item.kv_end || (p.causal && key0 + BN - 1 > warp_first_row + item.causal_offset);
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= p.scale_log2;
    }
    // One warp-uniform branch around the whole mask: a test per score costs a branch or a select each on
    // every tile, masked or not (see attention_fwd_sm90.cuh).
    if (need_mask) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = key0 + nt * 8 + 2 * t + (e & 1);
          const int row = row0 + (e >> 1) * 8;
          if (col >= item.kv_end || (p.causal && col > row + item.causal_offset)) s[nt][e] = -INFINITY;
        }
      }
    }

    // Online softmax: new running max, rescale what was accumulated, exponentiate.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = warp_quad_max(mx);
      const float m_new = fmaxf(row_max[r], mx);
      // A row that has seen no key yet keeps max -inf; subtracting 0 keeps exp2 at 0, not NaN.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = fast_exp2(row_max[r] - m_use);
      row_max[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        s[nt][2 * r] = fast_exp2(s[nt][2 * r] - m_use);
        s[nt][2 * r + 1] = fast_exp2(s[nt][2 * r + 1] - m_use);
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        o_acc[dn][2 * r] *= alpha;
        o_acc[dn][2 * r + 1] *= alpha;
      }
    }

    // O += P V, with P taken straight from the score registers (C layout == A layout in pairs).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_tile + swizzled<D>(kk * 16 + (lane & 15), dd * 16 + (lane >> 4) * 8));
        mma_bf16(o_acc[2 * dd], a, b[0], b[1]);
        mma_bf16(o_acc[2 * dd + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with buffer j&1 before iteration j+1 refills it
  }
  if (n_blocks == 0) cp_async_wait<0>();

  // Epilogue: normalise and write O (bf16) + LSE, or the fp32 partials of one KV split.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = warp_quad_sum(row_sum[r]);
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const float lse = total > 0.f ? row_max[r] * kLn2 + logf(total) : -INFINITY;
    const int local_row = warp * 16 + g + r * 8;
    if (local_row >= item.q_rows) continue;
    if (item.partial_slot < 0) {
      __nv_bfloat16* out = p.o + (item.q_row + local_row) * q_stride + head * D;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(out + dn * 8 + 2 * t) =
            pack_bf16(o_acc[dn][2 * r] * inv, o_acc[dn][2 * r + 1] * inv);
      }
      if (t == 0) p.lse[static_cast<int64_t>(head) * p.tq + item.q_row + local_row] = lse;
    } else {
      const int64_t base = (static_cast<int64_t>(item.partial_slot) * p.hq + head) * BM + local_row;
      float* out = p.partial_o + base * D;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<float2*>(out + dn * 8 + 2 * t) = make_float2(o_acc[dn][2 * r] * inv, o_acc[dn][2 * r + 1] * inv);
      }
      if (t == 0) p.partial_lse[base] = lse;
    }
  }
}

template <int D>
cudaError_t launch_attention_fwd(const FwdParams& p, int num_items, cudaStream_t stream) {
  using T = FwdTraits<D>;
  if (num_items == 0 || p.hq == 0) return cudaSuccess;
  cudaError_t err = set_max_dynamic_smem_once<attention_fwd_kernel<D>>(T::kSmemBytes);
  if (err != cudaSuccess) return err;
  attention_fwd_kernel<D><<<dim3(num_items, p.hq), T::kThreads, T::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cad::kernels::detail
