// sm80/fwd_kernel.cuh -- the portable varlen attention forward kernel (FlashAttention-2 style, sm_80 and
// later) and its main loop: loads, S = Q K^T, scaling and masking of the scores, O += P V. Its other
// concerns are files of their own:
//   sm80/fwd_softmax.cuh   the online softmax of a tile (why the masking stays here: see that file)
//   sm80/fwd_epilogue.cuh  O/LSE, or the split-KV partials
//   sm80/fwd_launch.cuh    grid and launch (no scheduler: one block per work item and query head)
// Tile loads (cp.async into the ldmatrix layout) are common/tile_load.cuh.
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
#include "sm80/fwd_epilogue.cuh"
#include "sm80/fwd_softmax.cuh"

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

    // Scale into base-2 units, then mask keys past the range end, (causal) above the diagonal and outside
    // the sliding window [row + offset - window_left, row + offset + window_right].
    const int key0 = item.kv_begin + j * BN;  // segment-relative key of column 0
    const bool need_mask =
        key0 + BN > item.kv_end || (p.causal && key0 + BN - 1 > warp_first_row + item.causal_offset) ||
        (p.window_left >= 0 && key0 < warp_first_row + 15 + item.causal_offset - p.window_left) ||
        (p.window_right >= 0 && key0 + BN - 1 > warp_first_row + item.causal_offset + p.window_right);
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= p.scale_log2;
    }
    // One warp-uniform branch around the whole mask: a test per score costs a branch or a select each on
    // every tile, masked or not (see sm90/fwd_softmax.cuh).
    if (need_mask) {
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = key0 + nt * 8 + 2 * t + (e & 1);
          const int row = row0 + (e >> 1) * 8;
          if (col >= item.kv_end || (p.causal && col > row + item.causal_offset) ||
              (p.window_left >= 0 && col < row + item.causal_offset - p.window_left) ||
              (p.window_right >= 0 && col > row + item.causal_offset + p.window_right)) {
            s[nt][e] = -INFINITY;
          }
        }
      }
    }

    fwd80_online_softmax<BN, D>(s, o_acc, row_max, row_sum);

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

  fwd80_epilogue<D, BM>(p, item, head, o_acc, row_max, row_sum, q_stride, warp, g, t);
}

}  // namespace cad::kernels::detail
