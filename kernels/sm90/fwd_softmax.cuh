// sm90/fwd_softmax.cuh -- masking and the online softmax of the Hopper forward, per consumer thread:
// its two query rows (g and g + 8 of its warp) against one tile of BN keys held in a wgmma accumulator
// (per n8 block: rows g, g + 8 x columns 2t, 2t + 1). Scores are in base-2 units; when the plan gave a
// positive scale_log2 the scale is folded into the exponent's FMA (fold_scale; scale_eff = scale_log2),
// else the scores are scaled first (scale_eff = 1). Causal masks are bottom-right aligned per segment
// (query i sees keys j <= i + causal_offset). The row statistics (running max, sum) live in the caller
// and are what the epilogue turns into 1/sum and the LSE. Sliding windows (the kernel's WINDOW instantiation)
// use fwd90_window_masks and fwd90_softmax_tile<BN, true>, which also mask each row's keys left of its window.
//
// Plain functions over the caller's arrays rather than an object holding them, and p and mask_from by
// reference: the same code as a struct with members, or with p.causal, p.scale_log2 and mask_from passed
// as values, compiled to different SASS, and the split of the kernel into these files had to leave the
// generated code unchanged (checked with cuobjdump -sass).
#pragma once

#include <cmath>

#include "attention_internal.h"
#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// Masks of one unit (causal per p.causal), in keys relative to kv_begin: row r of this thread sees key c
// iff c <= key_limit[r], and tiles j >= the returned mask_from hold a key that some row of this warp must
// not see (or lie past the segment's end). warp_row0 = this warp's first query in the tile, g = lane / 4.
template <int BN>
__device__ __forceinline__ int fwd90_masks(const FwdParams& p, const FwdItem& item, int n_keys, int warp_row0, int g,
                                           int (&key_limit)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = item.q_index + warp_row0 + g + r * 8;
    key_limit[r] = p.causal ? min(n_keys - 1, row + item.causal_offset - item.kv_begin) : n_keys - 1;
  }
  const int warp_limit =
      p.causal ? min(n_keys - 1, item.q_index + warp_row0 + item.causal_offset - item.kv_begin) : n_keys - 1;
  return warp_limit + 1 <= 0 ? 0 : (warp_limit + 1) / BN;
}

// Masks of one unit of a windowed problem (the kernel's WINDOW instantiation; fwd90_masks stays the unwindowed
// code), in keys relative to kv_begin: row r of this thread sees key c iff key_first[r] <= c <= key_limit[r],
// the window [row + causal_offset - window_left, row + causal_offset + window_right] cut to the item's keys
// (and, causal, to c <= row + causal_offset). Tiles j >= the returned mask_from hold a key past some row's
// upper limit (as fwd90_masks), tiles j < mask_until one below some row's first key: the plan starts the item
// at its first query's window (kv_begin = q_index + causal_offset - window_left, or later for a KV split), so
// only the first tile or two of an item need the left mask.
template <int BN>
__device__ __forceinline__ int fwd90_window_masks(const FwdParams& p, const FwdItem& item, int n_keys, int warp_row0,
                                                  int g, int (&key_limit)[2], int (&key_first)[2], int& mask_until) {
  // Limits of query `row` (tile-relative position in its segment), 64-bit: a window may be up to 2^30 wide.
  auto upper = [&](int row) {
    int64_t hi = n_keys - 1;
    const int64_t diag = int64_t{row} + item.causal_offset - item.kv_begin;
    if (p.causal) hi = min(hi, diag);
    if (p.window_right >= 0) hi = min(hi, diag + p.window_right);
    return static_cast<int>(max(hi, int64_t{-1}));
  };
  auto lower = [&](int row) {
    if (p.window_left < 0) return 0;
    const int64_t lo = int64_t{row} + item.causal_offset - item.kv_begin - p.window_left;
    return static_cast<int>(min(max(lo, int64_t{0}), int64_t{n_keys}));
  };
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = item.q_index + warp_row0 + g + r * 8;
    key_limit[r] = upper(row);
    key_first[r] = lower(row);
  }
  // The warp's first row has the lowest upper limit, its last (row 15) the highest first key.
  const int warp_limit = upper(item.q_index + warp_row0);
  const int warp_first = lower(item.q_index + warp_row0 + 15);
  mask_until = (warp_first + BN - 1) / BN;
  return warp_limit + 1 <= 0 ? 0 : (warp_limit + 1) / BN;
}

// Online softmax of tile j's scores in place; alpha = factor by which this thread's O rows must shrink.
// row_max is in the units of the (raw or pre-scaled) scores; t = lane % 4; p.scale_log2 scales the scores
// when it is not folded. kWindow (the kernel's WINDOW instantiation, masks from fwd90_window_masks): the left
// edge of the window is masked too, on tiles j < mask_until; without it key_first and mask_until are not
// read, and the unwindowed kernel's code is exactly what it was before windows (a compile-time flag).
template <int BN, bool kWindow>
__device__ __forceinline__ void fwd90_softmax_tile(float (&s)[BN / 2], int j, float (&alpha)[2], float (&row_max)[2],
                                                   float (&row_sum)[2], const int (&key_limit)[2],
                                                   const int (&key_first)[2], const int& mask_from,
                                                   const int& mask_until, int t, const FwdParams& p, bool fold_scale,
                                                   float scale_eff) {
  // Two separate, warp-uniform branches: written as per-score selects, the compiler if-converts them
  // and every tile pays a compare, two selects and a multiply per score (about 250 of the 670
  // instructions per tile and thread).
  if (!fold_scale) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] *= p.scale_log2;
  }
  if (j >= mask_from || (kWindow && j < mask_until)) {
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = j * BN + nt * 8 + 2 * t + (e & 1);
        if (c > key_limit[e >> 1] || (kWindow && c < key_first[e >> 1])) s[nt * 4 + e] = -INFINITY;
      }
    }
  }
  // Windowed, a row may have no key in this tile (or, in a KV split, in the whole item): its max stays -inf,
  // m_use 0, and its P and sum 0, as for a fully masked causal row.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    // One running chain: four chains joined at the end moved the forward by -3% to +2%, the noise (git history:
    // f6a60bf; bench/results/fwd_variants_h200x1_2026-12-04_f6a60bf).
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
    mx = warp_quad_max(mx);
    const float m_new = fmaxf(row_max[r], mx);
    const float m_use = m_new == -INFINITY ? 0.f : m_new * scale_eff;  // in base-2 units
    alpha[r] = fast_exp2(fmaf(row_max[r], scale_eff, -m_use));
    row_max[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
      s[nt * 4 + 2 * r] = fast_exp2(fmaf(s[nt * 4 + 2 * r], scale_eff, -m_use));
      s[nt * 4 + 2 * r + 1] = fast_exp2(fmaf(s[nt * 4 + 2 * r + 1], scale_eff, -m_use));
      sum += s[nt * 4 + 2 * r] + s[nt * 4 + 2 * r + 1];
    }
    row_sum[r] = row_sum[r] * alpha[r] + sum;
  }
}

// O rows shrink by alpha when a tile raised their running max (o_acc: a wgmma accumulator, N / 4 n8 blocks).
template <int N>
__device__ __forceinline__ void fwd90_rescale_o(float (&o_acc)[N], const float (&alpha)[2]) {
#pragma unroll
  for (int dn = 0; dn < N / 4; ++dn) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      o_acc[dn * 4 + 2 * r] *= alpha[r];
      o_acc[dn * 4 + 2 * r + 1] *= alpha[r];
    }
  }
}

}  // namespace cad::kernels::detail
