// sm90/bwd_mainloop.cuh -- the matrix products of the Hopper backward's consumer step that are not
// inline in the kernel skeleton (sm90/bwd_kernel.cuh).
#pragma once

#include <cstdint>

#include "sm90/wgmma.cuh"

namespace cad::kernels::detail {

// dV/dK += A (16 queries from registers) x B (16 x D, stored N-contiguous in shared memory).
template <int D>
__device__ __forceinline__ void wgmma_rs_tb_d(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (D == 128) {
    wgmma_m64n128k16_rs_tb(d, a, desc_b, 1);
  } else {
    wgmma_m64n64k16_rs_tb(d, a, desc_b, 1);
  }
}

}  // namespace cad::kernels::detail
