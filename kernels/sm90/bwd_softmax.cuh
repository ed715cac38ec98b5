// sm90/bwd_softmax.cuh -- the elementwise part of the Hopper backward's consumer step, per thread: its two
// keys (key_local, key_local + 8) against the step's 64 queries, in wgmma accumulators (per n8 block nt:
// keys g, g + 8 x queries 2t, 2t + 1). P^T = exp2(S^T scale_log2 - LSE), 0 outside the segment, above
// the causal diagonal (bottom-right aligned per segment) and, in the WINDOW kernel, outside each query's
// window (common/mask.cuh); dS^T = P^T (dP^T - Delta). LSE (base 2) and Delta of the step's queries come
// from the producer, through shared memory.
#pragma once

#include "attention_internal.h"
#include "common/mask.cuh"
#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// S^T -> P^T in place where the step needs the mask (some key of this warp past the tile's keys, some
// query past the segment, the causal diagonal crossing the warp's keys, or -- kWindow, the WINDOW kernel --
// some query's window edge), and without it (LSE read two at a time). Two functions and the choice between
// them left to the caller: one function taking the choice as a flag compiled to different SASS, and this
// split had to leave the generated code unchanged. kWindow: the WINDOW kernel's mask, in 64-bit positions (a
// window may be 2^30 wide); without it, 32-bit as before windows (common/mask.cuh, bwd_probability).
template <int BM, bool kWindow>
__device__ __forceinline__ void bwd90_probabilities_masked(float (&st)[BM / 2], const BwdParams& p,
                                                           const BwdItem& item, int key_local, int t, int q0,
                                                           const float* lse_tile) {
#pragma unroll
  for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      st[nt * 4 + e] = bwd_probability<kWindow>(p, item, key_local, t, q0, nt, e, st[nt * 4 + e], lse_tile);
    }
  }
}
template <int BM>
__device__ __forceinline__ void bwd90_probabilities_plain(float (&st)[BM / 2], const BwdParams& p, int t,
                                                          const float* lse_tile) {
#pragma unroll
  for (int nt = 0; nt < BM / 8; ++nt) {
    const float2 l = make_float2(lse_tile[nt * 8 + 2 * t], lse_tile[nt * 8 + 2 * t + 1]);  // any 4-byte alignment
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      st[nt * 4 + e] = fast_exp2(st[nt * 4 + e] * p.scale_log2 - ((e & 1) ? l.y : l.x));
    }
  }
}

// dP^T -> dS^T = P^T (dP^T - Delta) in place. Queries valid_q.. lie past the segment: their P^T is 0, and
// their Delta (another segment's, or whatever follows the workspace's last value) is taken as 0 so that
// no NaN or Inf there can turn 0 into NaN.
// kPartial: the step may hold such queries (a compile-time flag, so that full steps pay nothing for it).
template <int BM, bool kPartial>
__device__ __forceinline__ void bwd90_ds(float (&dpt)[BM / 2], const float (&pt)[BM / 2], const float* delta_tile,
                                         int t, int valid_q) {
#pragma unroll
  for (int nt = 0; nt < BM / 8; ++nt) {
    const int q = nt * 8 + 2 * t;
    float2 dl = make_float2(delta_tile[q], delta_tile[q + 1]);  // any 4-byte alignment
    if (kPartial) {
      dl.x = q < valid_q ? dl.x : 0.f;
      dl.y = q + 1 < valid_q ? dl.y : 0.f;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dpt[nt * 4 + e] = pt[nt * 4 + e] * (dpt[nt * 4 + e] - ((e & 1) ? dl.y : dl.x));
    }
  }
}

}  // namespace cad::kernels::detail
