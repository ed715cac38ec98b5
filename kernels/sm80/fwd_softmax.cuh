// sm80/fwd_softmax.cuh -- the online softmax of the portable forward, per thread: its two query rows
// (g and g + 8 of its warp's 16) against one tile of BN keys in mma.sync accumulators (s[n8 block][4]:
// rows g, g + 8 x columns 2t, 2t + 1), already scaled into base-2 units and masked by the main loop
// (sm80/fwd_kernel.cuh). Same statistics as the Hopper forward (sm90/fwd_softmax.cuh), which folds the
// scale into the exponent instead.
//
// The masking stays in the main loop: moved into a function here (every variant tried: by value, by
// reference, with or without its test), the compiler strength-reduced the key loop differently and the
// SASS changed, and this split had to leave the generated code unchanged.
#pragma once

#include <cmath>

#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// New running max per row, rescale of what was accumulated (row_sum and the O rows of o_acc), and the
// scores exponentiated in place: s becomes P (unnormalised) for the PV product.
template <int BN, int D>
__device__ __forceinline__ void fwd80_online_softmax(float (&s)[BN / 8][4], float (&o_acc)[D / 8][4],
                                                     float (&row_max)[2], float (&row_sum)[2]) {
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
}

}  // namespace cad::kernels::detail
