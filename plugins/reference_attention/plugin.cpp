// plugin.cpp -- the "reference" attention backend: ABI glue around reference_math (context, config,
// argument validation, bf16 conversion, timings, the entry table). The math lives in
// reference_math.cpp; this file only decides what is accepted and where results go.
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "bf16.h"
#include "cad_abi_v1_layout.h"
#include "cad_plugin_v1.h"
#include "parallel_for.h"
#include "plugin_support.h"
#include "reference_math.h"
#include "window.h"

namespace {

using cad::plugin::DType;
using cad::plugin::fail;
using cad::plugin::format;

constexpr int64_t kMaxHeadDim = 256;
constexpr const char* kName = "reference";

struct ReferenceContext {
  ReferenceContext(const cad_host_services_v1_t* services, const char* config_json)
      : logger(services, kName) {
    cad::plugin::ConfigReader config(config_json, "plugin 'reference' config");
    num_threads = static_cast<int>(config.get_int("num_threads", 0, 0, 1024));
    config.finish(logger);
    num_threads = cad::reference::resolve_num_threads(num_threads);
  }

  cad::plugin::ErrorState error;
  cad::plugin::Logger logger;
  int num_threads = 1;
  double forward_ms = 0;   // wall time of the last successful forward
  double backward_ms = 0;  // wall time of the last successful backward
};

ReferenceContext* as_context(void* ctx) { return static_cast<ReferenceContext*>(ctx); }

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// ---- validation ----------------------------------------------------------------------------------

std::string shape_text(const cad_tensor_v1_t* t) {
  std::string s = "[";
  for (int i = 0; i < t->ndim; ++i) s += (i ? ", " : "") + std::to_string(t->shape[i]);
  return s + "]";
}

// check_tensor() with free extents, then a shape check whose message names where `want` came from.
void check_like(const cad_tensor_v1_t* t, const char* name, std::vector<int64_t> want,
                std::vector<const char*> dims, DType dtype, const char* shape_source) {
  cad::plugin::check_tensor(t, {name, CAD_DEVICE_CPU, std::vector<int64_t>(want.size(), -1), dims, {dtype}});
  for (size_t i = 0; i < want.size(); ++i) {
    if (t->shape[i] == want[i]) continue;
    std::string expected = "[";
    for (size_t j = 0; j < want.size(); ++j) {
      expected += (j ? ", " : "") + std::string(dims[j]) + "=" + std::to_string(want[j]);
    }
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor '%s': shape %s does not match %s] from %s", name,
                                             shape_text(t).c_str(), expected.c_str(), shape_source));
  }
}

struct Inputs {
  cad::reference::AttentionBatch batch;
  DType dtype = DType::F32;
};

// Checks everything forward and backward share (the call's scalars, q, k, v, the segments) and
// returns the batch they describe.
template <class Args>
Inputs check_common(const Args* args, const char* call) {
  if (args == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: args is NULL", call));
  if (args->struct_size < cad::plugin::abi_v1_0_size(args)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s: args.struct_size is %zu, ABI v1.0 needs at least %zu", call,
                                         args->struct_size, cad::plugin::abi_v1_0_size(args)));
  }
  cad::plugin::refuse_partial_v1_1(args, call);
  if (args->stream != nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: stream must be NULL (the reference backend runs on the CPU)", call));
  }
  if (args->causal != 0 && args->causal != 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: causal must be 0 or 1, got %d", call, args->causal));
  }
  if (!std::isfinite(args->softmax_scale)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: softmax_scale must be finite, got %g", call, args->softmax_scale));
  }
  if (args->num_pieces != 0 || args->pieces != nullptr) {
    fail(CAD_STATUS_UNSUPPORTED, format("%s: the reference backend takes segments, not pieces (num_pieces=%lld)",
                                        call, static_cast<long long>(args->num_pieces)));
  }

  cad::plugin::check_tensor(args->q, {"q", CAD_DEVICE_CPU, {-1, -1, -1}, {"Tq", "Hq", "D"}, {DType::F32, DType::BF16}});
  Inputs in;
  in.dtype = cad::plugin::dtype_is(args->q->dtype, DType::BF16) ? DType::BF16 : DType::F32;
  cad::reference::AttentionBatch& b = in.batch;
  b.tq = args->q->shape[0];
  b.hq = args->q->shape[1];
  b.d = args->q->shape[2];
  if (b.hq == 0 || b.d == 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor 'q': Hq and D must be positive, shape %s", shape_text(args->q).c_str()));
  }
  if (b.d > kMaxHeadDim) {
    fail(CAD_STATUS_UNSUPPORTED, format("tensor 'q': head dim D=%lld is larger than %lld, the most this backend supports",
                                        static_cast<long long>(b.d), static_cast<long long>(kMaxHeadDim)));
  }
  cad::plugin::check_tensor(args->k, {"k", CAD_DEVICE_CPU, {-1, -1, -1}, {"Tk", "Hkv", "D"}, {in.dtype}});
  b.tk = args->k->shape[0];
  b.hkv = args->k->shape[1];
  check_like(args->k, "k", {b.tk, b.hkv, b.d}, {"Tk", "Hkv", "D"}, in.dtype, "tensor 'q' (D)");
  if (b.hkv == 0 || b.hq % b.hkv != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("grouped-query attention needs Hq %% Hkv == 0: tensor 'q' has Hq=%lld heads, tensor 'k' has Hkv=%lld",
                static_cast<long long>(b.hq), static_cast<long long>(b.hkv)));
  }
  check_like(args->v, "v", {b.tk, b.hkv, b.d}, {"Tk", "Hkv", "D"}, in.dtype, "tensor 'k'");

  cad::plugin::check_segments(args->segments, args->num_segments, b.tq, b.tk, args->causal == 1);
  b.segments = args->segments;
  b.num_segments = args->num_segments;
  b.softmax_scale = args->softmax_scale;
  b.causal = args->causal == 1;
  const cad::plugin::Window window = cad::plugin::read_window(args, b.causal, call);
  b.window_left = window.left;
  b.window_right = window.right;
  return in;
}

void check_query_shaped(const cad_tensor_v1_t* t, const char* name, const Inputs& in) {
  check_like(t, name, {in.batch.tq, in.batch.hq, in.batch.d}, {"Tq", "Hq", "D"}, in.dtype, "tensor 'q'");
}
void check_kv_shaped(const cad_tensor_v1_t* t, const char* name, const Inputs& in) {
  check_like(t, name, {in.batch.tk, in.batch.hkv, in.batch.d}, {"Tk", "Hkv", "D"}, in.dtype, "tensor 'k'");
}
void check_lse(const cad_tensor_v1_t* t, const Inputs& in) {
  check_like(t, "lse", {in.batch.hq, in.batch.tq}, {"Hq", "Tq"}, DType::F32, "tensor 'q' (always fp32)");
}

// ---- data in and out -----------------------------------------------------------------------------

// An fp32 view of a tensor: the tensor's own memory for fp32, a converted copy for bf16.
class Fp32View {
 public:
  Fp32View(const cad_tensor_v1_t* t, DType dtype, bool copy_in) : tensor_(t), dtype_(dtype) {
    if (dtype_ == DType::F32) return;
    const int64_t n = cad::plugin::tensor_numel(t);
    copy_.resize(static_cast<size_t>(n));
    if (copy_in) {
      cad::reference::bf16_to_float(static_cast<const uint16_t*>(cad::plugin::tensor_data(t)), copy_.data(), n);
    }
  }
  float* data() { return dtype_ == DType::F32 ? static_cast<float*>(cad::plugin::tensor_data(tensor_)) : copy_.data(); }
  // For outputs: round the fp32 results into the bf16 tensor (no-op for fp32).
  void write_back() {
    if (dtype_ == DType::F32) return;
    cad::reference::float_to_bf16(copy_.data(), static_cast<uint16_t*>(cad::plugin::tensor_data(tensor_)),
                                  static_cast<int64_t>(copy_.size()));
  }

 private:
  const cad_tensor_v1_t* tensor_;
  DType dtype_;
  std::vector<float> copy_;
};

// ---- the ABI table -------------------------------------------------------------------------------

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                    char* error_message, size_t error_capacity) {
  return cad::plugin::create_context<ReferenceContext>(services, config_json, out_ctx, error_message, error_capacity);
}

void destroy(void* ctx) { delete as_context(ctx); }  // no thread outlives a call: nothing to join

const char* last_error(void* ctx) {
  return ctx == nullptr ? "context is NULL" : as_context(ctx)->error.text();
}

cad_status_t get_capabilities(void* ctx, cad_attention_capabilities_v1_t* out) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  return cad::plugin::guarded(as_context(ctx)->error, [&] {
    if (out == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_capabilities: out is NULL");
    if (out->struct_size < sizeof(cad_attention_capabilities_v1_t)) {
      fail(CAD_STATUS_ABI_MISMATCH, format("get_capabilities: out.struct_size is %zu, ABI v1.0 needs at least %zu",
                                           out->struct_size, sizeof(cad_attention_capabilities_v1_t)));
    }
    out->device_type = CAD_DEVICE_CPU;
    out->dtype_mask = CAD_ATTENTION_DTYPE_FP32 | CAD_ATTENTION_DTYPE_BF16;
    out->flags = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA |
                 CAD_ATTENTION_CAP_SHARED_KV | CAD_ATTENTION_CAP_BACKWARD | CAD_ATTENTION_CAP_WINDOW;
    out->head_dim_mask = 0xffffu;  // 16, 32, ..., 256 (any other D <= 256 works too)
    out->max_head_dim = static_cast<int32_t>(kMaxHeadDim);
    out->min_compute_capability = 0;
  });
}

cad_status_t forward(void* ctx, const cad_attention_forward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  ReferenceContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    const Inputs in = check_common(args, "forward");
    check_query_shaped(args->o, "o", in);
    check_lse(args->lse, in);

    const auto start = std::chrono::steady_clock::now();
    Fp32View q(args->q, in.dtype, true), k(args->k, in.dtype, true), v(args->v, in.dtype, true);
    Fp32View o(args->o, in.dtype, false);
    cad::reference::attention_forward(in.batch, q.data(), k.data(), v.data(), o.data(),
                                      static_cast<float*>(cad::plugin::tensor_data(args->lse)), self.num_threads);
    o.write_back();
    self.forward_ms = elapsed_ms(start);
  });
}

cad_status_t backward(void* ctx, const cad_attention_backward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  ReferenceContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    const Inputs in = check_common(args, "backward");
    check_query_shaped(args->o, "o", in);
    check_lse(args->lse, in);
    check_query_shaped(args->d_o, "d_o", in);
    check_query_shaped(args->d_q, "d_q", in);
    check_kv_shaped(args->d_k, "d_k", in);
    check_kv_shaped(args->d_v, "d_v", in);

    const auto start = std::chrono::steady_clock::now();
    Fp32View q(args->q, in.dtype, true), k(args->k, in.dtype, true), v(args->v, in.dtype, true);
    Fp32View o(args->o, in.dtype, true), d_o(args->d_o, in.dtype, true);
    Fp32View d_q(args->d_q, in.dtype, false), d_k(args->d_k, in.dtype, false), d_v(args->d_v, in.dtype, false);
    cad::reference::attention_backward(in.batch, q.data(), k.data(), v.data(), o.data(),
                                       static_cast<const float*>(cad::plugin::tensor_data(args->lse)), d_o.data(),
                                       d_q.data(), d_k.data(), d_v.data(), self.num_threads);
    d_q.write_back();
    d_k.write_back();
    d_v.write_back();
    self.backward_ms = elapsed_ms(start);
  });
}

cad_status_t get_stats_json(void* ctx, char* buffer, size_t capacity, size_t* needed) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  ReferenceContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    const std::string json = format("{\"forward_ms\": %.6f, \"backward_ms\": %.6f}", self.forward_ms, self.backward_ms);
    cad::plugin::write_json_result(json, buffer, capacity, needed);
  });
}

const cad_attention_v1_t kAttentionTable = {
    sizeof(cad_attention_v1_t), create, destroy, last_error, get_capabilities, forward, backward, get_stats_json,
    nullptr, nullptr, nullptr,  // no plans: the CPU oracle has no work lists worth keeping
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_ATTENTION,
    kName,
    "1.0.0",
    "CPU reference attention (fp32/bf16, varlen, causal, sliding window, GQA, shared KV, backward): the numerical oracle",
    &kAttentionTable,
    nullptr,
    nullptr,
};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
