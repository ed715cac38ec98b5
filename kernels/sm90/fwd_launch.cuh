// sm90/fwd_launch.cuh -- host side of the Hopper forward: TMA descriptors of Q/K/V, the persistent grid
// and the walk's mode (sm90/fwd_scheduler.cuh), the shared-memory opt-in, the launch; and whether the
// loaded binary holds the real sm_90a kernel. Included by one translation unit per head dim
// (sm90/fwd_hd{64,128}_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_internal.h"
#include "sm90/async.cuh"
#include "sm90/fwd_kernel.cuh"
#include "sm90/fwd_scheduler.cuh"
#include "sm90/fwd_traits.cuh"

namespace cad::kernels::detail {

// WINDOW: the sliding-window instantiation of the kernel (sm90/fwd_kernel.cuh), for a windowed problem.
template <int D, int STAGES, bool WINDOW>
cudaError_t launch_attention_fwd_sm90_stages(const FwdParams& p, int num_items, cudaStream_t stream) {
  using T = Fwd90Traits<D, STAGES>;
  if (num_items == 0 || p.hq == 0) return cudaSuccess;
  CUtensorMap tm_q, tm_k, tm_v;
  const int hkv = p.hq / p.group;
  cudaError_t err = encode_rows_tensor_map(&tm_q, p.q, p.tq, p.hq, D, T::kBlockM);
  if (err == cudaSuccess) err = encode_rows_tensor_map(&tm_k, p.k, p.tk, hkv, D, T::kBlockN);
  if (err == cudaSuccess) err = encode_rows_tensor_map(&tm_v, p.v, p.tk, hkv, D, T::kBlockN);
  if (err != cudaSuccess) return err;
  int device = 0, sms = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  err = set_max_dynamic_smem_once<attention_fwd_sm90_kernel<D, STAGES, WINDOW>>(T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t units = static_cast<int64_t>(num_items) * p.hq;
  if (units > INT32_MAX / 2) return cudaErrorInvalidValue;
  const int grid = fwd90_grid(units, p.max_blocks > 0 && p.max_blocks < sms ? p.max_blocks : sms);
  FwdParams params = p;
  params.kv_head_bands = fwd90_kv_head_bands(p, num_items, grid);
  attention_fwd_sm90_kernel<D, STAGES, WINDOW>
      <<<grid, T::kThreads, T::kSmemBytes, stream>>>(params, tm_q, tm_k, tm_v, static_cast<int>(units));
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_attention_fwd_sm90(const FwdParams& p, int num_items, cudaStream_t stream) {
  // A window reaches here only when it hides some key (the plan drops any other): the unwindowed problem
  // runs exactly the kernel it ran before windows were supported here.
  if (p.window_left >= 0 || p.window_right >= 0) {
    return launch_attention_fwd_sm90_stages<D, kFwd90Stages, true>(p, num_items, stream);
  }
  return launch_attention_fwd_sm90_stages<D, kFwd90Stages, false>(p, num_items, stream);
}

// True when the loaded binary of the sm_90a kernel is real sm_90 code (not the stub of another arch).
template <int D>
bool attention_fwd_sm90_loaded() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, attention_fwd_sm90_kernel<D, kFwd90Stages>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
}

}  // namespace cad::kernels::detail
