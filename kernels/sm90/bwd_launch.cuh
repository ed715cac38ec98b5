// sm90/bwd_launch.cuh -- host side of the Hopper backward: TMA descriptors of Q, dO and the fp32 dQ
// accumulator, the shared-memory opt-in, one block per (work item, KV head) and the launch (the block order,
// heads_inner, is chosen by the caller: sm90/bwd_scheduler.cuh). Included by one translation unit per head
// dim (sm90/bwd_hd{64,128}_sm90.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention_internal.h"
#include "sm90/async.cuh"
#include "sm90/bwd_kernel.cuh"
#include "sm90/bwd_traits.cuh"

namespace cad::kernels::detail {

// The fp32 dQ accumulator [tokens, heads, D] for TMA reductions: boxes of 64 tokens x one head x 32
// columns (128 bytes, 128-byte swizzle).
template <int D>
cudaError_t encode_bwd_dq_tensor_map(CUtensorMap* map, float* base, int64_t tokens, int heads) {
  return encode_rows_tensor_map(map, base, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, tokens, heads, D, 32,
                                BwdWsTraits<D, 2>::kDQBoxRows);
}

// WINDOW: the sliding-window instantiation of the kernel (sm90/bwd_kernel.cuh), for a windowed problem.
template <int D, bool WINDOW>
cudaError_t launch_attention_bwd_sm90_window(const BwdParams& p, int num_items, bool heads_inner,
                                            cudaStream_t stream) {
  using T = BwdWsTraits<D, kBwdStages<D>>;
  if (num_items == 0 || p.hq == 0) return cudaSuccess;
  CUtensorMap tm_q, tm_do, tm_dq, tm_lse, tm_delta;
  cudaError_t err = encode_rows_tensor_map(&tm_q, p.q, p.tq, p.hq, D, T::kBlockM);
  if (err == cudaSuccess) err = encode_rows_tensor_map(&tm_do, p.d_o, p.tq, p.hq, D, T::kBlockM);
  if (err == cudaSuccess) err = encode_bwd_dq_tensor_map<D>(&tm_dq, p.dq_acc, p.tq, p.hq);
  // LSE (base 2) and Delta, [hq, tq] each in the workspace; the kernel's row coordinate is an int.
  const int64_t stat_elements = p.tq * p.hq;
  if (stat_elements >= INT32_MAX) return cudaErrorInvalidValue;
  if (err == cudaSuccess) err = encode_vector_tensor_map(&tm_lse, p.lse_log2, stat_elements, T::kStatLoad);
  if (err == cudaSuccess) err = encode_vector_tensor_map(&tm_delta, p.delta, stat_elements, T::kStatLoad);
  if (err != cudaSuccess) return err;
  constexpr auto kernel = attention_bwd_sm90_ws_kernel<D, kBwdStages<D>, WINDOW>;
  err = set_max_dynamic_smem_once<kernel>(T::kSmemBytes);
  if (err != cudaSuccess) return err;
  kernel<<<num_items * (p.hq / p.group), T::kThreads, T::kSmemBytes, stream>>>(p, tm_q, tm_do, tm_dq, tm_lse, tm_delta, num_items,
                                                                                   heads_inner ? 1 : 0);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_attention_bwd_sm90(const BwdParams& p, int num_items, bool heads_inner, cudaStream_t stream) {
  // A window reaches here only when it hides some key (the plan drops any other): the unwindowed problem
  // runs exactly the kernel it ran before windows were supported here.
  if (p.window_left >= 0 || p.window_right >= 0) {
    return launch_attention_bwd_sm90_window<D, true>(p, num_items, heads_inner, stream);
  }
  return launch_attention_bwd_sm90_window<D, false>(p, num_items, heads_inner, stream);
}

}  // namespace cad::kernels::detail
