// sm90/fwd_epilogue.cuh -- the end of one unit of the Hopper forward, per consumer thread: normalise its
// two O rows by the softmax sum and write O (bf16) and LSE (natural log) -- or, for a work item that is
// one piece of a split KV range, the fp32 partial O and LSE into the item's slot, which the combine
// kernel (attention_aux.cu) merges. Rows past the item's last query are not written.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "attention_internal.h"
#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// o_acc: the consumer's wgmma accumulator (per n8 block dn: rows g, g + 8 x columns 2t, 2t + 1);
// row_max in the softmax's score units, scale_eff the factor that takes them to base 2; q_stride = hq * D,
// the row stride of Q and O (the caller's: computed here per unit it would move the compiler's code).
template <int D, int BM>
__device__ __forceinline__ void fwd90_epilogue(const FwdParams& p, const FwdItem& item, int head,
                                               const float (&o_acc)[D / 2], const float (&row_max)[2],
                                               const float (&row_sum)[2], float scale_eff, int64_t q_stride,
                                               int warp_row0, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = warp_quad_sum(row_sum[r]);
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const float lse = total > 0.f ? row_max[r] * scale_eff * kLn2 + logf(total) : -INFINITY;
    const int local_row = warp_row0 + g + r * 8;
    if (local_row >= item.q_rows) continue;
    if (item.partial_slot < 0) {
      __nv_bfloat16* out = p.o + (item.q_row + local_row) * q_stride + head * D;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(out + dn * 8 + 2 * t) =
            pack_bf16(o_acc[dn * 4 + 2 * r] * inv, o_acc[dn * 4 + 2 * r + 1] * inv);
      }
      if (t == 0) p.lse[static_cast<int64_t>(head) * p.tq + item.q_row + local_row] = lse;
    } else {
      const int64_t base = (static_cast<int64_t>(item.partial_slot) * p.hq + head) * BM + local_row;
      float* out = p.partial_o + base * D;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<float2*>(out + dn * 8 + 2 * t) =
            make_float2(o_acc[dn * 4 + 2 * r] * inv, o_acc[dn * 4 + 2 * r + 1] * inv);
      }
      if (t == 0) p.partial_lse[base] = lse;
    }
  }
}

}  // namespace cad::kernels::detail
