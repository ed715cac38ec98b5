// attention_api.cpp -- attention_forward / attention_backward: copy a plan's tables into the caller's
// workspace and enqueue the kernels in order on the caller's stream. No allocation, no synchronisation.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <queue>
#include <vector>

#include "attention_internal.h"
#include "cad_kernels.h"
#include "host_staging.h"

namespace cad::kernels {
namespace {

// Host tables to the device in the order of `stream`. Through `staging` (pinned buffers) where the caller has
// one: the call never waits for the stream. Without it, straight from the plan's pageable memory, which CUDA
// may stage only after the stream has drained to the copy (host_staging.h). Either way the data is taken
// before the call returns, so the plan may be destroyed right after.
cudaError_t to_device(void* dst, const void* src, size_t bytes, cudaStream_t stream, HostStaging* staging) {
  if (staging != nullptr) return staging->copy(dst, src, bytes, stream);
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

template <class T>
cudaError_t upload(const std::vector<T>& host, char* workspace, size_t offset, cudaStream_t stream,
                   HostStaging* staging) {
  if (host.empty()) return cudaSuccess;
  return to_device(workspace + offset, host.data(), host.size() * sizeof(T), stream, staging);
}

// The forward's three tables go up in one copy: each pageable copy costs several microseconds of host
// time, during which the GPU waits when the call is on the critical path.
cudaError_t upload_tables(const ForwardPlan& plan, char* workspace, cudaStream_t stream, HostStaging* staging) {
  const size_t end = plan.uncovered_offset + plan.uncovered.size() * sizeof(RowRange);
  if (plan.items.empty() && plan.combines.empty() && plan.uncovered.empty()) return cudaSuccess;
  std::vector<char> image(end - plan.items_offset);
  auto place = [&](const auto& table, size_t offset) {
    if (!table.empty()) std::memcpy(image.data() + (offset - plan.items_offset), table.data(), table.size() * sizeof(table[0]));
  };
  place(plan.items, plan.items_offset);
  place(plan.combines, plan.combines_offset);
  place(plan.uncovered, plan.uncovered_offset);
  return to_device(workspace + plan.items_offset, image.data(), image.size(), stream, staging);
}

// Start order of the Hopper backward's blocks (sm90/bwd_scheduler.cuh, bwd_unit). The hardware starts
// blocks in index order, each SM taking the next one as it frees up, and the plan lists the items heaviest
// first. With the KV heads outermost, one head's light items start before the next head's heavy ones (dense
// causal 4K: the last SM ends after 1.6x the mean work); with the heads innermost the heaviest-first order
// holds, but the blocks running at once spread over all KV heads and their Q/dO rows miss L2 more often
// (measured -2% at dense causal 16K, -11% on a 64K buffer of short documents). So the heads go innermost
// only where simulating both orders (a step = 64 queries of one head, plus 2 per block to start and finish)
// gives a makespan more than 5% shorter.
bool bwd_heads_inner(const BackwardPlan& plan, int hkv, int group, int slots) {
  const int64_t n = static_cast<int64_t>(plan.items.size());
  const int64_t blocks = n * hkv;
  if (slots <= 0 || blocks <= slots || blocks > 16 * static_cast<int64_t>(slots)) return false;
  std::vector<int64_t> work(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t span = std::max<int64_t>(0, plan.items[i].q_end - plan.items[i].q_begin);  // q_len unwindowed
    work[i] = (span + 63) / 64 * group + 2;
  }
  auto makespan = [&](bool heads_inner) {
    std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> free_at;
    for (int s = 0; s < slots; ++s) free_at.push(0);
    int64_t end = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t done = free_at.top() + work[heads_inner ? b / hkv : b % n];
      free_at.pop();
      free_at.push(done);
      end = std::max(end, done);
    }
    return end;
  };
  return static_cast<double>(makespan(false)) > 1.05 * static_cast<double>(makespan(true));
}

#define CAD_CUDA_TRY(expr)                   \
  do {                                       \
    const cudaError_t cad_err_ = (expr);     \
    if (cad_err_ != cudaSuccess) return cad_err_; \
  } while (0)

}  // namespace

bool hopper_kernels_available() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0 && detail::attention_fwd_sm90_loaded<64>() && detail::attention_fwd_sm90_loaded<128>();
}

cudaError_t upload_forward_tables(const ForwardPlan& plan, void* workspace, cudaStream_t stream,
                                  HostStaging* staging) {
  return upload_tables(plan, static_cast<char*>(workspace), stream, staging);
}

cudaError_t attention_forward(const ForwardPlan& plan, const void* q, const void* k, const void* v, void* o,
                              float* lse, void* workspace, cudaStream_t stream, HostStaging* staging) {
  CAD_CUDA_TRY(upload_forward_tables(plan, workspace, stream, staging));
  return attention_forward_resident(plan, q, k, v, o, lse, workspace, stream);
}

cudaError_t attention_forward_resident(const ForwardPlan& plan, const void* q, const void* k, const void* v, void* o,
                                       float* lse, void* workspace, cudaStream_t stream) {
  const AttentionProblem& pr = plan.problem;
  if (!head_dim_supported(pr.head_dim) || pr.hkv <= 0 || pr.hq % pr.hkv != 0) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);

  detail::FwdParams p{};
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.k = static_cast<const __nv_bfloat16*>(k);
  p.v = static_cast<const __nv_bfloat16*>(v);
  p.o = static_cast<__nv_bfloat16*>(o);
  p.lse = lse;
  p.partial_o = reinterpret_cast<float*>(ws + plan.partial_o_offset);
  p.partial_lse = reinterpret_cast<float*>(ws + plan.partial_lse_offset);
  p.items = reinterpret_cast<const FwdItem*>(ws + plan.items_offset);
  p.tq = pr.tq;
  p.tk = pr.tk;
  p.hq = pr.hq;
  p.group = pr.hq / pr.hkv;
  p.scale_log2 = pr.softmax_scale * detail::kLog2e;
  p.causal = pr.causal ? 1 : 0;
  p.window_left = pr.window_left;
  p.window_right = pr.window_right;
  p.block_m = plan.block_m;  // (every kernel masks windows)
  p.max_blocks = plan.max_blocks;
  if (plan.block_m != fwd_block_m(pr)) return cudaErrorInvalidValue;

  CAD_CUDA_TRY(detail::launch_fill_uncovered(reinterpret_cast<const RowRange*>(ws + plan.uncovered_offset),
                                             static_cast<int>(plan.uncovered.size()), p.o, lse, pr.tq, pr.hq,
                                             pr.head_dim, stream));
  const int n = static_cast<int>(plan.items.size());
  if (pr.hopper) {
    if (plan.dynamic_walk && n > 0) {
      p.unit_counter = reinterpret_cast<int*>(ws + plan.unit_counter_offset);
      CAD_CUDA_TRY(cudaMemsetAsync(p.unit_counter, 0, sizeof(int), stream));
    }
    CAD_CUDA_TRY(pr.head_dim == 64 ? detail::launch_attention_fwd_sm90<64>(p, n, stream)
                                   : detail::launch_attention_fwd_sm90<128>(p, n, stream));
  } else {
    CAD_CUDA_TRY(pr.head_dim == 64 ? detail::launch_attention_fwd<64>(p, n, stream)
                                   : detail::launch_attention_fwd<128>(p, n, stream));
  }
  return detail::launch_fwd_combine(p, reinterpret_cast<const CombineItem*>(ws + plan.combines_offset),
                                    static_cast<int>(plan.combines.size()), pr.head_dim, stream);
}

cudaError_t upload_backward_tables(const BackwardPlan& plan, void* workspace, cudaStream_t stream,
                                   HostStaging* staging) {
  return upload(plan.items, static_cast<char*>(workspace), plan.items_offset, stream, staging);
}

cudaError_t attention_backward(const BackwardPlan& plan, const void* q, const void* k, const void* v, const void* o,
                               const float* lse, const void* d_o, void* d_q, void* d_k, void* d_v,
                               void* workspace, cudaStream_t stream, HostStaging* staging) {
  CAD_CUDA_TRY(upload_backward_tables(plan, workspace, stream, staging));
  return attention_backward_resident(plan, q, k, v, o, lse, d_o, d_q, d_k, d_v, workspace, stream);
}

cudaError_t attention_backward_resident(const BackwardPlan& plan, const void* q, const void* k, const void* v,
                                        const void* o, const float* lse, const void* d_o, void* d_q, void* d_k,
                                        void* d_v, void* workspace, cudaStream_t stream) {
  const AttentionProblem& pr = plan.problem;
  if (!head_dim_supported(pr.head_dim) || pr.hkv <= 0 || pr.hq % pr.hkv != 0) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  const size_t q_elems = static_cast<size_t>(pr.tq) * pr.hq * pr.head_dim;
  const size_t kv_elems = static_cast<size_t>(pr.tk) * pr.hkv * pr.head_dim;
  const size_t kv_row_bytes = static_cast<size_t>(pr.hkv) * pr.head_dim * sizeof(__nv_bfloat16);

  detail::BwdParams p{};
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.k = static_cast<const __nv_bfloat16*>(k);
  p.v = static_cast<const __nv_bfloat16*>(v);
  p.d_o = static_cast<const __nv_bfloat16*>(d_o);
  p.lse = lse;
  float* delta = reinterpret_cast<float*>(ws + plan.delta_offset);
  float* lse_log2 = reinterpret_cast<float*>(ws + plan.lse_log2_offset);
  p.delta = delta;
  p.lse_log2 = lse_log2;
  p.dq_acc = reinterpret_cast<float*>(ws + plan.dq_acc_offset);
  p.dk_acc = plan.kv_exclusive ? nullptr : reinterpret_cast<float*>(ws + plan.dk_acc_offset);
  p.dv_acc = plan.kv_exclusive ? nullptr : reinterpret_cast<float*>(ws + plan.dv_acc_offset);
  p.d_k = static_cast<__nv_bfloat16*>(d_k);
  p.d_v = static_cast<__nv_bfloat16*>(d_v);
  p.items = reinterpret_cast<const BwdItem*>(ws + plan.items_offset);
  p.tq = pr.tq;
  p.hq = pr.hq;
  p.group = pr.hq / pr.hkv;
  p.scale = pr.softmax_scale;
  p.scale_log2 = pr.softmax_scale * detail::kLog2e;
  p.causal = pr.causal ? 1 : 0;
  p.window_left = pr.window_left;
  p.window_right = pr.window_right;
  p.kv_exclusive = plan.kv_exclusive ? 1 : 0;

  CAD_CUDA_TRY(cudaMemsetAsync(p.dq_acc, 0, q_elems * sizeof(float), stream));
  if (plan.kv_exclusive) {
    // Key rows nobody reads get no work item: their gradient is 0.
    for (const RowRange& r : plan.unread_kv) {
      CAD_CUDA_TRY(cudaMemsetAsync(static_cast<char*>(d_k) + r.begin * kv_row_bytes, 0,
                                   (r.end - r.begin) * kv_row_bytes, stream));
      CAD_CUDA_TRY(cudaMemsetAsync(static_cast<char*>(d_v) + r.begin * kv_row_bytes, 0,
                                   (r.end - r.begin) * kv_row_bytes, stream));
    }
  } else {
    CAD_CUDA_TRY(cudaMemsetAsync(p.dk_acc, 0, kv_elems * sizeof(float), stream));
    CAD_CUDA_TRY(cudaMemsetAsync(p.dv_acc, 0, kv_elems * sizeof(float), stream));
  }
  CAD_CUDA_TRY(detail::launch_bwd_preprocess(static_cast<const __nv_bfloat16*>(o), p.d_o, lse, delta, lse_log2, pr.tq, pr.hq,
                                             pr.head_dim, stream));
  const int n = static_cast<int>(plan.items.size());
  if (pr.hopper) {
    int device = 0, sms = 0;
    CAD_CUDA_TRY(cudaGetDevice(&device));
    CAD_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    // One block per SM (sm90/bwd_kernel.cuh).
    const bool heads_inner = bwd_heads_inner(plan, pr.hkv, p.group, sms);
    CAD_CUDA_TRY(pr.head_dim == 64 ? detail::launch_attention_bwd_sm90<64>(p, n, heads_inner, stream)
                                   : detail::launch_attention_bwd_sm90<128>(p, n, heads_inner, stream));
  } else {
    CAD_CUDA_TRY(pr.head_dim == 64 ? detail::launch_attention_bwd<64>(p, n, stream)
                                   : detail::launch_attention_bwd<128>(p, n, stream));
  }
  CAD_CUDA_TRY(detail::launch_f32_to_bf16(p.dq_acc, static_cast<__nv_bfloat16*>(d_q), static_cast<int64_t>(q_elems),
                                           pr.softmax_scale, stream));
  if (!plan.kv_exclusive) {
    CAD_CUDA_TRY(detail::launch_f32_to_bf16(p.dk_acc, p.d_k, static_cast<int64_t>(kv_elems), 1.f, stream));
    CAD_CUDA_TRY(detail::launch_f32_to_bf16(p.dv_acc, p.d_v, static_cast<int64_t>(kv_elems), 1.f, stream));
  }
  return cudaSuccess;
}

}  // namespace cad::kernels
