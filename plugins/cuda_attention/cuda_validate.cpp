// cuda_validate.cpp -- argument checks of the "cuda" attention backend. Only descriptors and the host
// segment table are read here; tensor memory is never touched on the host.
#include "cuda_validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "plugin_support.h"
#include "window.h"

namespace cad::cuda_backend {
namespace {

using plugin::DType;
using plugin::fail;
using plugin::format;

std::string shape_text(const cad_tensor_v1_t* t) {
  std::string s = "[";
  for (int i = 0; i < t->ndim; ++i) s += (i ? ", " : "") + std::to_string(t->shape[i]);
  return s + "]";
}

// check_tensor() on a CUDA tensor of the instance's device, then the exact shape `want`, whose origin
// (`source`) the message names. TMA and cp.async move 16-byte chunks: the data must be 16-byte aligned.
void check_exact(const cad_tensor_v1_t* t, const char* name, const std::vector<int64_t>& want,
                 const std::vector<const char*>& dims, DType dtype, const char* source, int device_id) {
  plugin::check_tensor(t, {name, CAD_DEVICE_CUDA, std::vector<int64_t>(want.size(), -1), dims, {DType::F32, DType::BF16}});
  if (!plugin::dtype_is(t->dtype, dtype)) {
    fail(dtype == DType::BF16 ? CAD_STATUS_UNSUPPORTED : CAD_STATUS_INVALID_ARGUMENT,
         format("tensor '%s': cuda backend: dtype %s not supported; use %s", name, plugin::dtype_name(t->dtype),
                dtype == DType::BF16 ? "bf16" : "fp32"));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (t->shape[i] == want[i]) continue;
    std::string expected = "[";
    for (size_t j = 0; j < want.size(); ++j) expected += (j ? ", " : "") + std::string(dims[j]) + "=" + std::to_string(want[j]);
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor '%s': shape %s does not match %s] from %s", name,
                                             shape_text(t).c_str(), expected.c_str(), source));
  }
  if (t->device.device_id != device_id) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor '%s' is on CUDA device %d, this instance runs on device %d", name,
                                             t->device.device_id, device_id));
  }
  if (reinterpret_cast<uintptr_t>(plugin::tensor_data(t)) % 16 != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor '%s': data + byte_offset must be 16-byte aligned", name));
  }
}

// The kernels' window (32-bit, like their segment indices): a limit past the longest segment they take is no
// limit at all, so it is clamped there (the window of the call is otherwise exactly the kernels').
void set_window(kernels::AttentionProblem& pr, const plugin::Window& window) {
  constexpr int64_t kMaxWindow = std::numeric_limits<int32_t>::max() / 2;
  pr.window_left = static_cast<int32_t>(std::min(window.left, kMaxWindow));
  pr.window_right = static_cast<int32_t>(std::min(window.right, kMaxWindow));
}

template <class Args>
kernels::AttentionProblem check_common(const Args* args, const char* call, int device_id) {
  if (args == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: args is NULL", call));
  if (args->struct_size < plugin::abi_v1_0_size(args)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s: args.struct_size is %zu, ABI v1.0 needs at least %zu", call,
                                         args->struct_size, plugin::abi_v1_0_size(args)));
  }
  plugin::refuse_partial_v1_1(args, call);
  if (args->causal != 0 && args->causal != 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: causal must be 0 or 1, got %d", call, args->causal));
  }
  // Sliding windows (CAD_ATTENTION_CAP_WINDOW) run on the kernels `hopper` picks, wgmma or mma.sync (kernels/cad_kernels.h).
  const plugin::Window window = plugin::read_window(args, args->causal == 1, call);
  if (!std::isfinite(args->softmax_scale)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: softmax_scale must be finite, got %g", call, args->softmax_scale));
  }
  if (args->num_pieces != 0 || args->pieces != nullptr) {
    fail(CAD_STATUS_UNSUPPORTED, format("%s: the cuda backend takes segments, not pieces (num_pieces=%lld)", call,
                                        static_cast<long long>(args->num_pieces)));
  }
  // q first: its dtype and head dim decide what this backend can do at all.
  plugin::check_tensor(args->q, {"q", CAD_DEVICE_CUDA, {-1, -1, -1}, {"Tq", "Hq", "D"}, {DType::F32, DType::BF16}});
  if (!plugin::dtype_is(args->q->dtype, DType::BF16)) {
    fail(CAD_STATUS_UNSUPPORTED, format("cuda backend: dtype %s not supported; use bf16", plugin::dtype_name(args->q->dtype)));
  }
  kernels::AttentionProblem pr;
  pr.tq = args->q->shape[0];
  const int64_t hq = args->q->shape[1], d = args->q->shape[2];
  if (hq <= 0 || hq > 65535) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor 'q': Hq must be in [1, 65535], shape %s", shape_text(args->q).c_str()));
  }
  if (d != 64 && d != 128) {
    fail(CAD_STATUS_UNSUPPORTED, format("cuda backend: head dim D=%lld not supported (tensor 'q' %s); supported: 64, 128",
                                        static_cast<long long>(d), shape_text(args->q).c_str()));
  }
  pr.hq = static_cast<int>(hq);
  pr.head_dim = static_cast<int>(d);
  check_exact(args->q, "q", {pr.tq, hq, d}, {"Tq", "Hq", "D"}, DType::BF16, "tensor 'q'", device_id);
  plugin::check_tensor(args->k, {"k", CAD_DEVICE_CUDA, {-1, -1, -1}, {"Tk", "Hkv", "D"}, {DType::F32, DType::BF16}});
  pr.tk = args->k->shape[0];
  const int64_t hkv = args->k->shape[1];
  check_exact(args->k, "k", {pr.tk, hkv, d}, {"Tk", "Hkv", "D"}, DType::BF16, "tensor 'q' (D)", device_id);
  if (hkv <= 0 || hq % hkv != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("grouped-query attention needs Hq %% Hkv == 0: tensor 'q' has Hq=%lld heads, tensor 'k' has Hkv=%lld",
                static_cast<long long>(hq), static_cast<long long>(hkv)));
  }
  pr.hkv = static_cast<int>(hkv);
  check_exact(args->v, "v", {pr.tk, hkv, d}, {"Tk", "Hkv", "D"}, DType::BF16, "tensor 'k'", device_id);

  plugin::check_segments(args->segments, args->num_segments, pr.tq, pr.tk, args->causal == 1);
  // The kernels index inside a segment with 32-bit integers.
  constexpr int64_t kMaxLen = std::numeric_limits<int32_t>::max() / 2;
  for (int64_t i = 0; i < args->num_segments; ++i) {
    if (args->segments[i].q_len > kMaxLen || args->segments[i].kv_len > kMaxLen) {
      fail(CAD_STATUS_UNSUPPORTED, format("segment %lld: q_len/kv_len above %lld tokens are not supported",
                                          static_cast<long long>(i), static_cast<long long>(kMaxLen)));
    }
  }
  pr.softmax_scale = args->softmax_scale;
  pr.causal = args->causal == 1;
  set_window(pr, window);
  return pr;
}

void check_query_shaped(const cad_tensor_v1_t* t, const char* name, const kernels::AttentionProblem& pr, int dev) {
  check_exact(t, name, {pr.tq, pr.hq, pr.head_dim}, {"Tq", "Hq", "D"}, DType::BF16, "tensor 'q'", dev);
}
void check_kv_shaped(const cad_tensor_v1_t* t, const char* name, const kernels::AttentionProblem& pr, int dev) {
  check_exact(t, name, {pr.tk, pr.hkv, pr.head_dim}, {"Tk", "Hkv", "D"}, DType::BF16, "tensor 'k'", dev);
}
void check_lse(const cad_tensor_v1_t* t, const kernels::AttentionProblem& pr, int dev) {
  check_exact(t, "lse", {pr.hq, pr.tq}, {"Hq", "Tq"}, DType::F32, "tensor 'q' (always fp32)", dev);
}

}  // namespace

kernels::AttentionProblem check_forward(const cad_attention_forward_args_v1_t* args, int device_id) {
  const kernels::AttentionProblem pr = check_common(args, "forward", device_id);
  check_query_shaped(args->o, "o", pr, device_id);
  check_lse(args->lse, pr, device_id);
  return pr;
}

kernels::AttentionProblem check_backward(const cad_attention_backward_args_v1_t* args, int device_id) {
  const kernels::AttentionProblem pr = check_common(args, "backward", device_id);
  check_query_shaped(args->o, "o", pr, device_id);
  check_lse(args->lse, pr, device_id);
  check_query_shaped(args->d_o, "d_o", pr, device_id);
  check_query_shaped(args->d_q, "d_q", pr, device_id);
  check_kv_shaped(args->d_k, "d_k", pr, device_id);
  check_kv_shaped(args->d_v, "d_v", pr, device_id);
  return pr;
}

kernels::AttentionProblem check_plan(const cad_attention_plan_args_v1_t* args, int device_id) {
  if (args->device.device_type != CAD_DEVICE_CUDA || args->device.device_id != device_id) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("make_plan: device (type %d, id %d) is not this instance's CUDA device %d",
                                             args->device.device_type, args->device.device_id, device_id));
  }
  if (!plugin::dtype_is(args->dtype, DType::BF16)) {
    fail(CAD_STATUS_UNSUPPORTED, format("make_plan: dtype %s not supported; use bf16", plugin::dtype_name(args->dtype)));
  }
  if (args->head_dim != 64 && args->head_dim != 128) {
    fail(CAD_STATUS_UNSUPPORTED, format("make_plan: head dim %d not supported; supported: 64, 128", args->head_dim));
  }
  if (args->num_q_heads < 1 || args->num_q_heads > 65535 || args->num_kv_heads < 1 ||
      args->num_q_heads % args->num_kv_heads != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("make_plan: Hq=%d, Hkv=%d: need 1 <= Hq <= 65535 and Hq %% Hkv == 0",
                                             args->num_q_heads, args->num_kv_heads));
  }
  if (args->causal != 0 && args->causal != 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("make_plan: causal must be 0 or 1, got %d", args->causal));
  }
  const plugin::Window window = plugin::read_window(args, args->causal == 1, "make_plan");
  if (args->num_pieces != 0 || args->pieces != nullptr) {
    fail(CAD_STATUS_UNSUPPORTED, "make_plan: the cuda backend takes segments, not pieces");
  }
  if (args->num_q_rows < 0 || args->num_kv_rows < 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "make_plan: num_q_rows and num_kv_rows must be >= 0");
  }
  plugin::check_segments(args->segments, args->num_segments, args->num_q_rows, args->num_kv_rows, args->causal == 1);
  constexpr int64_t kMaxLen = std::numeric_limits<int32_t>::max() / 2;
  for (int64_t i = 0; i < args->num_segments; ++i) {
    if (args->segments[i].q_len > kMaxLen || args->segments[i].kv_len > kMaxLen) {
      fail(CAD_STATUS_UNSUPPORTED, format("make_plan: segment %lld: q_len/kv_len above %lld tokens are not supported",
                                          static_cast<long long>(i), static_cast<long long>(kMaxLen)));
    }
  }
  kernels::AttentionProblem pr;
  pr.tq = args->num_q_rows;
  pr.tk = args->num_kv_rows;
  pr.hq = args->num_q_heads;
  pr.hkv = args->num_kv_heads;
  pr.head_dim = args->head_dim;
  pr.causal = args->causal == 1;
  set_window(pr, window);
  pr.softmax_scale = 1.0f;  // per call
  return pr;
}

}  // namespace cad::cuda_backend
