// sm80/bwd_softmax.cuh -- the elementwise part of the portable backward's step, per thread: its two keys
// (key_local, key_local + 8 of its warp's 16) against the step's BM queries, in mma.sync accumulators
// (st[n8 block][4]: keys g, g + 8 x queries 2t, 2t + 1). P^T = exp2(S^T scale_log2 - LSE), 0 outside the
// segment, above the causal diagonal (bottom-right aligned per segment) and outside each query's sliding
// window (common/mask.cuh), and dS^T = P^T (dP^T - Delta) in the same pass. LSE (base 2) and Delta of the
// step's queries are in shared memory. The Hopper backward's version is sm90/bwd_softmax.cuh.
#pragma once

#include "attention_internal.h"
#include "common/mask.cuh"
#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// st: S^T -> P^T, dpt: dP^T -> dS^T, in place. q0 = the step's first query (segment-relative). One kernel
// for every problem: the window's test always runs (-1 passes it), in 32-bit positions as this kernel always
// compared them (common/mask.cuh).
template <int BM>
__device__ __forceinline__ void bwd80_probabilities_and_ds(float (&st)[BM / 8][4], float (&dpt)[BM / 8][4],
                                                           const BwdParams& p, const BwdItem& item, int key_local,
                                                           int t, int q0, const float* lse_tile,
                                                           const float* delta_tile) {
#pragma unroll
  for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ql = nt * 8 + 2 * t + (e & 1);
      const float prob = bwd_probability<true, int>(p, item, key_local, t, q0, nt, e, st[nt][e], lse_tile);
      st[nt][e] = prob;
      dpt[nt][e] = prob * (dpt[nt][e] - delta_tile[ql]);
    }
  }
}

}  // namespace cad::kernels::detail
