// sm90/bwd_epilogue.cuh -- the outputs of the Hopper backward: dK and dV of a block's keys at its end,
// per consumer thread from its wgmma accumulators. (dQ leaves every step through shared memory and the dQ
// writer warp's TMA reductions; see sm90/bwd_kernel.cuh.)
#pragma once

#include <cstdint>

#include "attention_internal.h"
#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// Writes this thread's dK (scaled) and dV rows of a key tile: directly in bf16 when every key row has one
// writer (exclusive KV), else added to the fp32 accumulators.
template <int D>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const float (&dk)[D / 2], const float (&dv)[D / 2],
                                            int key_local, int t, int kv_rows, int64_t key_row0, int64_t kv_stride,
                                            int kv_head) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_local + r * 8;
    if (key >= kv_rows) continue;
    const int64_t offset = (key_row0 + key) * kv_stride + kv_head * D + 2 * t;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      const float k0 = dk[dn * 4 + 2 * r] * p.scale, k1 = dk[dn * 4 + 2 * r + 1] * p.scale;
      const float v0 = dv[dn * 4 + 2 * r], v1 = dv[dn * 4 + 2 * r + 1];
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
