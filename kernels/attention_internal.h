// attention_internal.h -- what the attention translation units share: kernel parameter blocks and the
// per-head-dim launchers (each defined in its own .cu so that CI compiles one instantiation per TU).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cad_kernels.h"

namespace cad::kernels::detail {

constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

struct FwdParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  __nv_bfloat16* o;
  float* lse;
  float* partial_o;    // [slots, hq, block_m, D] fp32
  float* partial_lse;  // [slots, hq, block_m]
  const FwdItem* items;
  int64_t tq;
  int64_t tk;  // rows of K/V
  int hq;
  int group;  // hq / hkv
  float scale_log2;
  int causal;
  int window_left;   // sliding window (AttentionProblem), -1 = no limit
  int window_right;
  int block_m;  // queries per work item: the kernel's tile height
  int kv_head_bands;  // Hopper forward: walk units in bands of items by KV head (set by its launcher)
  int max_blocks;     // Hopper forward: at most this many persistent blocks (ForwardPlan::max_blocks; 0: one per SM)
  int* unit_counter;  // Hopper forward: the dynamic walk's next free unit, zeroed before the launch; null: static walk
};

struct BwdParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const __nv_bfloat16* d_o;
  const float* lse;    // [hq, tq]
  const float* delta;  // [hq, tq]: rowsum(dO * O)
  const float* lse_log2;  // [hq, tq]: lse * log2(e), written beside delta by the preprocess (sm_90a reads it by TMA)
  float* dq_acc;       // [tq, hq, D] fp32, dS K before softmax_scale (launch_f32_to_bf16 applies it)
  float* dk_acc;       // [tk, hkv, D] fp32 (shared-KV mode)
  float* dv_acc;
  __nv_bfloat16* d_k;  // direct bf16 output (exclusive-KV mode)
  __nv_bfloat16* d_v;
  const BwdItem* items;
  int64_t tq;
  int hq;
  int group;
  float scale;
  float scale_log2;
  int causal;
  int window_left;   // sliding window (AttentionProblem), -1 = no limit
  int window_right;
  int kv_exclusive;
};

// Raises `Kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per device and
// kernel: cudaFuncSetAttribute costs host time on every launch otherwise, and launches sit on the
// critical path of short attention calls. (A cudaDeviceReset drops the setting; this cache then goes stale, so
// a host that resets the device must do so in a fresh process.)
template <auto Kernel>
cudaError_t set_max_dynamic_smem_once(int bytes) {
  static std::atomic<uint64_t> done{0};  // bit d: done on device d (devices >= 64: every time)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
  return err;
}

template <int D>
cudaError_t launch_attention_fwd(const FwdParams& p, int num_items, cudaStream_t stream);
template <int D>
cudaError_t launch_attention_fwd_sm90(const FwdParams& p, int num_items, cudaStream_t stream);
template <int D>
bool attention_fwd_sm90_loaded();
// heads_inner: block b runs item b / hkv and KV head b % hkv (else item b % num_items, head b / num_items).
template <int D>
cudaError_t launch_attention_bwd_sm90(const BwdParams& p, int num_items, bool heads_inner, cudaStream_t stream);
template <int D>
cudaError_t launch_attention_bwd(const BwdParams& p, int num_items, cudaStream_t stream);

// attention_aux.cu
cudaError_t launch_fwd_combine(const FwdParams& p, const CombineItem* combines, int num_combines, int head_dim,
                               cudaStream_t stream);
cudaError_t launch_fill_uncovered(const RowRange* ranges, int num_ranges, __nv_bfloat16* o, float* lse, int64_t tq,
                                  int hq, int head_dim, cudaStream_t stream);
// delta[h, row] = rowsum(dO * O) and lse_log2[h, row] = lse * log2(e), both [hq, tq].
cudaError_t launch_bwd_preprocess(const __nv_bfloat16* o, const __nv_bfloat16* d_o, const float* lse, float* delta,
                                  float* lse_log2, int64_t tq, int hq, int head_dim, cudaStream_t stream);
// dst = bf16(scale * src), numel a multiple of 4.
cudaError_t launch_f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t numel, float scale, cudaStream_t stream);

}  // namespace cad::kernels::detail
