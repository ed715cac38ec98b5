// sm80/bwd_epilogue.cuh -- the outputs of the portable backward, per thread from its mma.sync
// accumulators: every step, its part of dQ (unscaled: the conversion to bf16 scales it) added into the fp32
// accumulator with atomics (several blocks write the same query rows); at the block's end, dK (scaled) and dV of its two keys -- directly in
// bf16 when every key row has one writer (exclusive KV), else added to the fp32 accumulators. The Hopper
// backward's version is sm90/bwd_epilogue.cuh.
#pragma once

#include <cstdint>

#include "attention_internal.h"
#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// dq[m16 block][n8 block][4]: rows q0 + mm*16 + g (+ 8) x columns warp_col0 + dn*8 + 2t (+1) of head h;
// rows past the segment are skipped. q_stride = hq * D.
template <int D, int BM, int COLS>
__device__ __forceinline__ void bwd80_add_dq(const BwdParams& p, const BwdItem& item,
                                             const float (&dq)[BM / 16][COLS / 8][4], int q0, int h, int64_t q_stride,
                                             int warp_col0, int g, int t) {
#pragma unroll
  for (int mm = 0; mm < BM / 16; ++mm) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = q0 + mm * 16 + g + r * 8;
      if (q >= item.q_len) continue;
      float* dst = p.dq_acc + (item.q_row + q) * q_stride + h * D + warp_col0 + 2 * t;
#pragma unroll
      for (int dn = 0; dn < COLS / 8; ++dn) {
        atomic_add_pair(dst + dn * 8, dq[mm][dn][2 * r], dq[mm][dn][2 * r + 1]);
      }
    }
  }
}

// dK = scale * dS^T Q, dV = P^T dO for this thread's keys key_local, key_local + 8 of the tile.
template <int D>
__device__ __forceinline__ void bwd80_store_dk_dv(const BwdParams& p, const float (&dk)[D / 8][4],
                                                  const float (&dv)[D / 8][4], int key_local, int t, int kv_rows,
                                                  int64_t key_row0, int64_t kv_stride, int kv_head) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_local + r * 8;
    if (key >= kv_rows) continue;
    const int64_t offset = (key_row0 + key) * kv_stride + kv_head * D + 2 * t;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      const float k0 = dk[dn][2 * r] * p.scale, k1 = dk[dn][2 * r + 1] * p.scale;
      const float v0 = dv[dn][2 * r], v1 = dv[dn][2 * r + 1];
      if (p.kv_exclusive) {
        *reinterpret_cast<uint32_t*>(p.d_k + offset + dn * 8) = pack_bf16(k0, k1);
        *reinterpret_cast<uint32_t*>(p.d_v + offset + dn * 8) = pack_bf16(v0, v1);
      } else {
        atomic_add_pair(p.dk_acc + offset + dn * 8, k0, k1);
        atomic_add_pair(p.dv_acc + offset + dn * 8, v0, v1);
      }
    }
  }
}

}  // namespace cad::kernels::detail
