// call_check.cpp -- see call_check.h.
#include "call_check.h"

#include <cstring>
#include <type_traits>
#include <utility>

#include "plugin_support.h"
#include "window.h"

namespace cad::cad_plugin {

using plugin::DType;
using plugin::fail;
using plugin::format;

namespace {

long long ll(int64_t x) { return static_cast<long long>(x); }
unsigned long long ull(uint64_t x) { return static_cast<unsigned long long>(x); }

// The call's tensors, named as its struct names them, with the spec each must meet.
using Named = std::pair<const cad_tensor_v1_t*, plugin::TensorSpec>;

template <class Args>
std::vector<Named> tensors_of(const Args* args, const CallShape& s, bool backward, const char* fixed_by) {
  const DType dtype = s.bf16 ? DType::BF16 : DType::F32;
  const auto q_like = [&](const char* name, const cad_tensor_v1_t* t) {
    return Named{t, {name, s.device_type, {s.tokens, s.num_q_heads, s.head_dim}, {"Tq", "Hq", "D"}, {dtype}, fixed_by}};
  };
  const auto kv_like = [&](const char* name, const cad_tensor_v1_t* t) {
    return Named{t, {name, s.device_type, {s.tokens, s.num_kv_heads, s.head_dim}, {"Tk", "Hkv", "D"}, {dtype}, fixed_by}};
  };
  std::vector<Named> all = {q_like("q", args->q), kv_like("k", args->k), kv_like("v", args->v), q_like("o", args->o),
                            Named{args->lse, {"lse", s.device_type, {s.num_q_heads, s.tokens}, {"Hq", "Tq"},
                                              {DType::F32}, fixed_by}}};
  if constexpr (std::is_same_v<Args, cad_attention_backward_args_v1_t>) {
    if (backward) {
      all.push_back(q_like("d_o", args->d_o));
      all.push_back(q_like("d_q", args->d_q));
      all.push_back(kv_like("d_k", args->d_k));
      all.push_back(kv_like("d_v", args->d_v));
    }
  }
  return all;
}

// A call without a plan: its shape from its pieces and q/k, checked against the server backend's capabilities
// (what make_plan checks for a plan).
template <class Args>
CallShape shape_of_unplanned(const Args* args, const plugin::Window& window, const Accepts& accepts) {
  CallShape shape;
  shape.window_left = check_window(window, args->causal, accepts);
  shape.tokens = count_tokens(args->pieces, args->num_pieces);
  check_causal(args->causal, accepts);
  const cad_device_type_t dev = accepts.device_type;
  plugin::check_tensor(args->q, {"q", dev, {-1, -1, -1}, {"Tq", "Hq", "D"}, accepted_dtypes(accepts)});
  const auto check_rows = [&](const cad_tensor_v1_t* t, const char* name, const char* dim) {
    if (t->shape[0] != shape.tokens) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor '%s' has %lld rows (%s) but the local pieces hold %lld tokens",
                                               name, ll(t->shape[0]), dim, ll(shape.tokens)));
    }
  };
  check_rows(args->q, "q", "Tq");
  shape.bf16 = plugin::dtype_is(args->q->dtype, DType::BF16);
  const int64_t hq = args->q->shape[1], d = args->q->shape[2];
  plugin::check_tensor(args->k, {"k", dev, {-1, -1, d}, {"Tk", "Hkv", "D"}, {shape.bf16 ? DType::BF16 : DType::F32}});
  check_rows(args->k, "k", "Tk");
  const int64_t hkv = args->k->shape[1];
  check_heads(hq, hkv, d, accepts);
  shape.num_q_heads = static_cast<int32_t>(hq);
  shape.num_kv_heads = static_cast<int32_t>(hkv);
  shape.head_dim = static_cast<int32_t>(d);
  shape.causal = args->causal == 1;
  shape.device_type = dev;
  shape.device_id = dev == CAD_DEVICE_CUDA ? args->q->device.device_id : 0;
  return shape;
}

// A call with a plan: the plan's shape; the mask and pieces the call still carries compared with the plan's.
template <class Args>
CallShape shape_of_planned(const Args* args, const plugin::Window& window, const PlanFixed& plan, const char* what) {
  const CallShape& fixed = plan.shape;
  if (args->causal != 0 && args->causal != 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: causal is %d, expected 0 or 1", what, args->causal));
  }
  if ((args->causal == 1) != fixed.causal) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: causal is %d but plan #%llu was made with causal = %d (the plan fixes the mask: a plan per mask "
                "kind)", what, args->causal, ull(plan.serial), fixed.causal ? 1 : 0));
  }
  if (window.left != fixed.window_left) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: window_left is %lld but plan #%llu was made for window_left %lld (-1: none); a windowed layer "
                "needs its own plan", what, ll(window.left), ull(plan.serial), ll(fixed.window_left)));
  }
  if (args->num_pieces < 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: num_pieces is %lld, expected >= 0", what, ll(args->num_pieces)));
  }
  if (args->num_pieces > 0) {
    if (args->pieces == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: pieces is NULL but num_pieces > 0", what));
    const bool same = static_cast<int64_t>(plan.pieces.size()) == args->num_pieces &&
                      std::memcmp(plan.pieces.data(), args->pieces, plan.pieces.size() * sizeof(cad_piece_v1_t)) == 0;
    if (!same) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: the call's pieces differ from those plan #%llu was made for (a plan "
                                               "from another micro-batch?)", what, ull(plan.serial)));
    }
  }
  return fixed;
}

template <class Args>
CallShape check_args(const Args* args, const char* what, bool backward, const Accepts& accepts, const PlanFixed* plan) {
  if (args == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: args is NULL", what));
  if (args->struct_size < plugin::abi_v1_0_size(args)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s: args.struct_size is %zu, expected >= %zu", what, args->struct_size,
                                         plugin::abi_v1_0_size(args)));
  }
  plugin::refuse_partial_v1_1(args, what);
  const plugin::Window window = plugin::read_window(args, args->causal == 1, what);
  if (backward && !(accepts.flags & CAD_ATTENTION_CAP_BACKWARD)) {
    fail(CAD_STATUS_UNSUPPORTED, "backward: the server backend does not support it");
  }
  if (args->num_segments != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: CAD takes pieces, not segments (num_segments must be 0)", what));
  }
  if (args->stream != nullptr && accepts.device_type == CAD_DEVICE_CPU) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "stream must be NULL: the server backend, and so CAD's data path, is on the CPU");
  }
  CallShape shape = plan != nullptr ? shape_of_planned(args, window, *plan, what)
                                    : shape_of_unplanned(args, window, accepts);
  const std::string fixed_by = plan != nullptr ? format("plan #%llu", ull(plan->serial)) : std::string();
  for (const Named& t : tensors_of(args, shape, backward, plan != nullptr ? fixed_by.c_str() : nullptr)) {
    plugin::check_tensor(t.first, t.second);
    if (shape.device_type == CAD_DEVICE_CUDA && t.first->device.device_id != shape.device_id) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           plan != nullptr ? format("tensor '%s' is on CUDA device %d but plan #%llu was made for device %d",
                                    t.second.name, t.first->device.device_id, ull(plan->serial), shape.device_id)
                           : format("tensor '%s' is on CUDA device %d but tensor 'q' on device %d", t.second.name,
                                    t.first->device.device_id, shape.device_id));
    }
  }
  if (!(args->softmax_scale > 0.0f) || args->softmax_scale > 1e30f) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("softmax_scale is %g, expected a finite value > 0", static_cast<double>(args->softmax_scale)));
  }
  shape.softmax_scale = args->softmax_scale;
  return shape;
}

}  // namespace

CallShape check_call(const CallArgs& call, const Accepts& accepts, const PlanFixed* plan) {
  if (call.kind == kForward) return check_args(call.forward, "forward", false, accepts, plan);
  return check_args(call.backward, "backward", true, accepts, plan);
}

}  // namespace cad::cad_plugin
