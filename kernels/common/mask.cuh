// common/mask.cuh -- which keys a query of a backward item sees, and the masked probability P^T, for both
// backward kernels (sm80/bwd_softmax.cuh, every step; sm90/bwd_softmax.cuh, the steps that need a mask).
// Both hold S^T in the same accumulator layout: per n8 block nt, e = 0..3 is key key_local + (e >> 1) * 8 x
// query 2t + (e & 1) of the block. The forwards mask by per-row key limits instead (sm90/fwd_softmax.cuh;
// sm80/fwd_kernel.cuh keeps its mask in the main loop, see sm80/fwd_softmax.cuh).
#pragma once

#include <cstdint>

#include "attention_internal.h"
#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// P^T of score (nt, e) -- s, S^T in the scores' units -- of a step whose first query is q0: exp2(s scale_log2 -
// LSE) where the query (segment-relative) sees the key (relative to item.kv_begin), else 0. Sees: both lie in
// the item (key < kv_rows, q < q_len); causal: key position kv_begin + key <= q + causal_offset (bottom-right
// aligned per segment); kWindow: also inside the query's window [q + causal_offset - window_left,
// q + causal_offset + window_right] (-1 = no limit).
// kWindow, a compile-time flag: the unwindowed Hopper kernel tests nothing more than before windows. Pos: the
// integer type the window's positions are compared in -- int64_t (a window may be up to 2^30 wide) in the
// Hopper WINDOW kernel; int in the portable kernel (one kernel for every problem, 32-bit as it always was).
// Written so that the kernels' generated code stayed what it was when each kernel had its own copy (checked
// with cuobjdump -sass), hence its shape: the position and the value computed here rather than a bool
// returned to the caller (the compiler simplified such a test before inlining it and reordered its
// compares), key and query derived here from (nt, e) for the same reason, the unwindowed test as its own
// expression, and the window's query position computed after the range test.
template <bool kWindow, typename Pos = int64_t>
__device__ __forceinline__ float bwd_probability(const BwdParams& p, const BwdItem& item, int key_local, int t, int q0,
                                                 int nt, int e, float s, const float* lse_tile) {
  const int key = key_local + (e >> 1) * 8;
  const int ql = nt * 8 + 2 * t + (e & 1);
  const int q = q0 + ql;
  bool valid;
  if constexpr (kWindow) {
    const Pos k_pos = item.kv_begin + key;
    valid = false;
    if (key < item.kv_rows && q < item.q_len) {
      const Pos q_pos = Pos{q} + item.causal_offset;
      valid = (!p.causal || k_pos <= q_pos) && (p.window_left < 0 || k_pos >= q_pos - p.window_left) &&
              (p.window_right < 0 || k_pos <= q_pos + p.window_right);
    }
  } else {
    valid = key < item.kv_rows && q < item.q_len && (!p.causal || item.kv_begin + key <= q + item.causal_offset);
  }
  return valid ? fast_exp2(s * p.scale_log2 - lse_tile[ql]) : 0.f;
}

}  // namespace cad::kernels::detail
