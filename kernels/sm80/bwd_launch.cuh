// sm80/bwd_launch.cuh -- host side of the portable backward: one block per (work item, KV head), the
// shared-memory opt-in, the launch. Included by one translation unit per head dim
// (sm80/bwd_hd{64,128}_sm80.cu).
#pragma once

#include <cuda_runtime.h>

#include "attention_internal.h"
#include "sm80/bwd_kernel.cuh"

namespace cad::kernels::detail {

template <int D>
cudaError_t launch_attention_bwd(const BwdParams& p, int num_items, cudaStream_t stream) {
  using T = BwdTraits<D>;
  if (num_items == 0 || p.hq == 0) return cudaSuccess;
  cudaError_t err = set_max_dynamic_smem_once<attention_bwd_kernel<D>>(T::kSmemBytes);
  if (err != cudaSuccess) return err;
  attention_bwd_kernel<D><<<dim3(num_items, p.hq / p.group), T::kThreads, T::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cad::kernels::detail
