// plugin.cpp -- the "callback_attention" attention backend: validates each call as every backend does, then
// hands it to the functions the host process registered under the config's key (registry.h,
// cad_callback_attention_v1.h), or, for the one direction the config gives to an inner instance (inner.h), to
// that instance. The math is theirs; this file decides what reaches them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cad_abi_v1_layout.h"
#include "cad_plugin_v1.h"
#include "plugin_support.h"
#include "inner.h"
#include "registry.h"
#include "window.h"

namespace {

using cad::plugin::DType;
using cad::plugin::fail;
using cad::plugin::format;

constexpr const char* kName = "callback_attention";
constexpr size_t kCallbackErrorCapacity = 4096;
using cad::callback_attention::Direction;

// A plan (ABI v1.1) of an instance with an inner instance that makes plans: the segment table (calls made with a
// plan may leave theirs out; the callbacks always get one) and the inner instance's own plan of the batch.
struct CallbackPlan {
  std::vector<cad_segment_v1_t> segments;
  void* inner_plan = nullptr;
};

struct CallbackContext {
  CallbackContext(const cad_host_services_v1_t* services, const char* config_json) : logger(services, kName) {
    cad::plugin::ConfigReader config(config_json, "plugin 'callback_attention' config");
    if (!config.has("key")) {
      fail(CAD_STATUS_INVALID_CONFIG, "plugin 'callback_attention' config: 'key' is required: the key under which the "
                                      "host process registered its callbacks (e.g. {\"key\": \"torch\"})");
    }
    const std::string key = config.get_string("key", "");
    inner = cad::callback_attention::read_inner(config, services);
    config.finish(logger);
    registration = cad::callback_attention::find(key);
    const bool callbacks_backward = registration->table.backward != nullptr;
    if (inner) {
      accepts = cad::callback_attention::combined(registration->table.capabilities, callbacks_backward, *inner, key);
    } else {
      accepts = registration->table.capabilities;
      if (!callbacks_backward) accepts.flags &= ~static_cast<uint32_t>(CAD_ATTENTION_CAP_BACKWARD);
    }
  }

  ~CallbackContext() {
    // Plans the caller never released (a broken rule): the wrappers go; the inner plans are the inner's.
    for (auto& [handle, plan] : plans) delete plan;
  }

  const cad_callback_attention_v1_t& table() const { return registration->table; }
  const cad_attention_capabilities_v1_t& caps() const { return accepts; }
  // Whether the inner instance runs direction `d` (else the callbacks do).
  bool inner_runs(Direction d) const { return inner && inner->runs == d; }
  // Who computes this instance's calls, for messages.
  std::string served_by() const {
    const std::string callbacks = "the callbacks registered under '" + registration->key + "'";
    return inner ? callbacks + " with inner instance '" + inner->name + "'" : callbacks;
  }

  cad::plugin::ErrorState error;
  cad::plugin::Logger logger;
  std::shared_ptr<cad::callback_attention::Registration> registration;
  std::optional<cad::callback_attention::Inner> inner;
  cad_attention_capabilities_v1_t accepts{};  // the registration's, or both directions' (combined)
  std::mutex plans_mutex;                     // make_plan may run on a planning thread beside the calls
  std::map<void*, CallbackPlan*> plans;       // the live plans this instance made
  double forward_ms = 0;
  double backward_ms = 0;
  int64_t forward_calls = 0;
  int64_t backward_calls = 0;
};

CallbackContext* as_context(void* ctx) { return static_cast<CallbackContext*>(ctx); }

// ---- validation: what every backend checks, against the registered capabilities --------------------

struct Shape {
  int64_t tq = 0, tk = 0, hq = 0, hkv = 0, d = 0;
  DType dtype = DType::F32;
  cad::plugin::Window window;
};

std::vector<DType> accepted(const cad_attention_capabilities_v1_t& caps) {
  std::vector<DType> out;
  if (caps.dtype_mask & CAD_ATTENTION_DTYPE_FP32) out.push_back(DType::F32);
  if (caps.dtype_mask & CAD_ATTENTION_DTYPE_BF16) out.push_back(DType::BF16);
  return out;
}

void check_shaped(const cad_tensor_v1_t* t, const char* name, const CallbackContext& self, std::vector<int64_t> want,
                  std::vector<const char*> dims, DType dtype) {
  cad::plugin::check_tensor(t, {name, self.caps().device_type, want, dims, {dtype}});
}

void check_device_id(const cad_tensor_v1_t* t, const char* name, int32_t device_id) {
  if (t->device.device_id != device_id) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("tensor '%s' is on device %d, tensor 'q' on device %d: one device", name,
                                             t->device.device_id, device_id));
  }
}

template <class Args>
Shape check_common(const CallbackContext& self, const Args* args, const char* call) {
  if (args == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: args is NULL", call));
  if (args->struct_size < cad::plugin::abi_v1_0_size(args)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s: args.struct_size is %zu, ABI v1.0 needs at least %zu", call,
                                         args->struct_size, cad::plugin::abi_v1_0_size(args)));
  }
  cad::plugin::refuse_partial_v1_1(args, call);
  const cad_attention_capabilities_v1_t& caps = self.caps();
  if (args->causal != 0 && args->causal != 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: causal must be 0 or 1, got %d", call, args->causal));
  }
  if (!(caps.flags & (args->causal ? CAD_ATTENTION_CAP_CAUSAL : CAD_ATTENTION_CAP_NONCAUSAL))) {
    fail(CAD_STATUS_UNSUPPORTED, format("%s: %s do not compute %s attention", call,
                                        self.served_by().c_str(), args->causal ? "causal" : "non-causal"));
  }
  if (!std::isfinite(args->softmax_scale)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: softmax_scale must be finite, got %g", call, args->softmax_scale));
  }
  if (args->num_pieces != 0 || args->pieces != nullptr) {
    fail(CAD_STATUS_UNSUPPORTED, format("%s: the callback_attention backend takes segments, not pieces "
                                        "(num_pieces=%lld)", call, static_cast<long long>(args->num_pieces)));
  }
  if (caps.device_type == CAD_DEVICE_CPU && args->stream != nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: stream must be NULL (the callbacks run on the CPU)", call));
  }
  const std::vector<DType> dtypes = accepted(caps);
  cad::plugin::check_tensor(args->q, {"q", caps.device_type, {-1, -1, -1}, {"Tq", "Hq", "D"}, dtypes});
  Shape s;
  s.dtype = cad::plugin::dtype_is(args->q->dtype, DType::BF16) ? DType::BF16 : DType::F32;
  s.tq = args->q->shape[0];
  s.hq = args->q->shape[1];
  s.d = args->q->shape[2];
  if (s.hq == 0 || s.d == 0) fail(CAD_STATUS_INVALID_ARGUMENT, "tensor 'q': Hq and D must be positive");
  const bool in_mask = s.d % 16 == 0 && s.d / 16 >= 1 && s.d / 16 <= 32 && (caps.head_dim_mask >> (s.d / 16 - 1)) & 1u;
  if (s.d > caps.max_head_dim || !in_mask) {
    fail(CAD_STATUS_UNSUPPORTED, format("tensor 'q': head dim D=%lld is not one %s "
                                        "support (head_dim_mask 0x%x, at most %d)", static_cast<long long>(s.d),
                                        self.served_by().c_str(), caps.head_dim_mask, caps.max_head_dim));
  }
  cad::plugin::check_tensor(args->k, {"k", caps.device_type, {-1, -1, s.d}, {"Tk", "Hkv", "D"}, {s.dtype}});
  s.tk = args->k->shape[0];
  s.hkv = args->k->shape[1];
  if (s.hkv == 0 || s.hq % s.hkv != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("grouped-query attention needs Hq %% Hkv == 0: tensor 'q' has Hq=%lld heads, tensor 'k' has Hkv=%lld",
                static_cast<long long>(s.hq), static_cast<long long>(s.hkv)));
  }
  if (s.hq != s.hkv && !(caps.flags & CAD_ATTENTION_CAP_GQA)) {
    fail(CAD_STATUS_UNSUPPORTED, format("tensors 'q' (Hq=%lld) and 'k' (Hkv=%lld): %s "
                                        "do not compute grouped-query attention", static_cast<long long>(s.hq),
                                        static_cast<long long>(s.hkv), self.served_by().c_str()));
  }
  check_shaped(args->v, "v", self, {s.tk, s.hkv, s.d}, {"Tk", "Hkv", "D"}, s.dtype);
  check_device_id(args->k, "k", args->q->device.device_id);
  check_device_id(args->v, "v", args->q->device.device_id);
  cad::plugin::check_segments(args->segments, args->num_segments, s.tq, s.tk, args->causal == 1);
  if (!(caps.flags & CAD_ATTENTION_CAP_SHARED_KV)) {
    // Without CAP_SHARED_KV no two segments may read one K/V row.
    std::vector<std::pair<int64_t, int64_t>> kv;
    for (int64_t i = 0; i < args->num_segments; ++i) {
      if (args->segments[i].kv_len > 0) kv.emplace_back(args->segments[i].kv_offset, args->segments[i].kv_len);
    }
    std::sort(kv.begin(), kv.end());
    for (size_t i = 1; i < kv.size(); ++i) {
      if (kv[i - 1].first + kv[i - 1].second > kv[i].first) {
        fail(CAD_STATUS_UNSUPPORTED, format("%s: segments share K/V rows, which %s do "
                                            "not support", call, self.served_by().c_str()));
      }
    }
  }
  s.window = cad::plugin::read_window(args, args->causal == 1, call);
  if (!(caps.flags & CAD_ATTENTION_CAP_WINDOW)) cad::plugin::refuse_window(s.window, kName, call);
  return s;
}

template <class Args>
void check_device_ids(const Args* args, std::initializer_list<std::pair<const cad_tensor_v1_t*, const char*>> tensors) {
  for (const auto& [t, name] : tensors) check_device_id(t, name, args->q->device.device_id);
}

// The full v1.2 struct a callback sees: the caller's fields, the normalised window, no plan, no saved.
template <class Args>
Args normalised(const Args* args, const Shape& s) {
  Args out;
  std::memset(&out, 0, sizeof(out));
  std::memcpy(&out, args, std::min(args->struct_size, sizeof(out)));
  out.struct_size = sizeof(out);
  out.plan = nullptr;
  out.saved = {};
  out.window_flags = CAD_WINDOW_GIVEN;
  out.reserved_v1_2 = 0;
  out.window_left = s.window.left;
  out.window_right = s.window.right;
  return out;
}

// The caller's args with a plan resolved: `plan` set to the live plan given (or NULL), the copy's segments the
// plan's where the caller left them out, and its plan slot NULL, so that the checks see one segment table.
template <class Args>
Args resolved(CallbackContext& self, const Args* args, const char* call, const CallbackPlan** plan) {
  if (args == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: args is NULL", call));
  *plan = nullptr;
  Args out;
  std::memset(&out, 0, sizeof(out));
  std::memcpy(&out, args, std::min(args->struct_size, sizeof(out)));  // struct_size stays the caller's
  if (!CAD_HAS_FIELD(Args, args, plan) || args->plan == nullptr) return out;
  {
    std::lock_guard<std::mutex> lock(self.plans_mutex);
    const auto it = self.plans.find(args->plan);
    if (it == self.plans.end()) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: plan %p is not a live plan of this instance (made by its "
                                               "make_plan and not released)", call, args->plan));
    }
    *plan = it->second;
  }
  const std::vector<cad_segment_v1_t>& segments = (*plan)->segments;
  if (args->segments == nullptr && args->num_segments == 0) {
    out.segments = segments.data();
    out.num_segments = static_cast<int64_t>(segments.size());
  } else if (args->num_segments != static_cast<int64_t>(segments.size()) || args->segments == nullptr ||
             !std::equal(segments.begin(), segments.end(), args->segments, [](const auto& a, const auto& b) {
               return a.q_offset == b.q_offset && a.q_len == b.q_len && a.kv_offset == b.kv_offset &&
                      a.kv_len == b.kv_len;
             })) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: the segments given differ from the plan's (%lld segments given, "
                                             "%zu in the plan); give the plan's or none", call,
                                             static_cast<long long>(args->num_segments), segments.size()));
  }
  out.plan = nullptr;
  return out;
}

// The inner instance's call: the checked, normalised args with its own plan of the batch (or the segments).
template <class Args, class Call>
void call_inner(const CallbackContext& self, Call call, Args args, const CallbackPlan* plan, const char* what) {
  if (plan != nullptr && plan->inner_plan != nullptr) {
    args.plan = plan->inner_plan;
    args.segments = nullptr;
    args.num_segments = 0;
  }
  const cad_status_t status = call(self.inner->instance, &args);
  if (status != CAD_STATUS_OK) {
    fail(status, format("%s: inner instance '%s' failed: %s", what, self.inner->name.c_str(),
                        self.inner->last_error().c_str()));
  }
}

template <class Fn, class Args>
void call_back(const CallbackContext& self, Fn fn, const Args& args, const char* call) {
  std::vector<char> message(kCallbackErrorCapacity, '\0');
  const cad_status_t status = fn(self.table().user_data, &args, message.data(), message.size());
  if (status == CAD_STATUS_OK) return;
  message.back() = '\0';
  const bool known = status > CAD_STATUS_OK && status <= CAD_STATUS_INTERNAL;
  fail(known ? status : CAD_STATUS_INTERNAL,
       format("%s callback '%s' failed%s: %s", call, self.registration->key.c_str(),
              known ? "" : format(" with status %d, which is not a cad_status_t", status).c_str(),
              message[0] ? message.data() : "(no message)"));
}

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

// ---- the ABI table -------------------------------------------------------------------------------

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                    char* error_message, size_t error_capacity) {
  return cad::plugin::create_context<CallbackContext>(services, config_json, out_ctx, error_message, error_capacity);
}

void destroy(void* ctx) { delete as_context(ctx); }  // drops the registration; may call its release

const char* last_error(void* ctx) { return ctx == nullptr ? "context is NULL" : as_context(ctx)->error.text(); }

cad_status_t get_capabilities(void* ctx, cad_attention_capabilities_v1_t* out) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    if (out == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_capabilities: out is NULL");
    if (out->struct_size < sizeof(cad_attention_capabilities_v1_t)) {
      fail(CAD_STATUS_ABI_MISMATCH, format("get_capabilities: out.struct_size is %zu, ABI v1.0 needs at least %zu",
                                           out->struct_size, sizeof(cad_attention_capabilities_v1_t)));
    }
    const size_t size = out->struct_size;
    *out = self.caps();
    out->struct_size = size;
  });
}

cad_status_t forward(void* ctx, const cad_attention_forward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    const CallbackPlan* plan = nullptr;
    const cad_attention_forward_args_v1_t given = resolved(self, args, "forward", &plan);
    const Shape s = check_common(self, &given, "forward");
    check_shaped(args->o, "o", self, {s.tq, s.hq, s.d}, {"Tq", "Hq", "D"}, s.dtype);
    check_shaped(args->lse, "lse", self, {s.hq, s.tq}, {"Hq", "Tq"}, DType::F32);
    check_device_ids(args, {{args->o, "o"}, {args->lse, "lse"}});
    const auto start = std::chrono::steady_clock::now();
    if (self.inner_runs(Direction::Forward)) {
      call_inner(self, self.inner->table->forward, normalised(&given, s), plan, "forward");
    } else {
      call_back(self, self.table().forward, normalised(&given, s), "forward");
    }
    if (CAD_HAS_FIELD(cad_attention_forward_args_v1_t, args, saved) && args->saved != nullptr) {
      *args->saved = nullptr;  // nothing kept: the backward gets Q/K/V/O/LSE from its tensors
    }
    self.forward_ms = elapsed_ms(start);
    ++self.forward_calls;
  });
}

cad_status_t backward(void* ctx, const cad_attention_backward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    if (!self.inner_runs(Direction::Backward) && self.table().backward == nullptr) {
      fail(CAD_STATUS_UNSUPPORTED, "backward: the callbacks registered under '" + self.registration->key +
                                       "' have no backward");
    }
    const CallbackPlan* plan = nullptr;
    const cad_attention_backward_args_v1_t given = resolved(self, args, "backward", &plan);
    const Shape s = check_common(self, &given, "backward");
    for (const auto& [t, name] : {std::pair{args->o, "o"}, {args->d_o, "d_o"}, {args->d_q, "d_q"}}) {
      check_shaped(t, name, self, {s.tq, s.hq, s.d}, {"Tq", "Hq", "D"}, s.dtype);
    }
    check_shaped(args->lse, "lse", self, {s.hq, s.tq}, {"Hq", "Tq"}, DType::F32);
    check_shaped(args->d_k, "d_k", self, {s.tk, s.hkv, s.d}, {"Tk", "Hkv", "D"}, s.dtype);
    check_shaped(args->d_v, "d_v", self, {s.tk, s.hkv, s.d}, {"Tk", "Hkv", "D"}, s.dtype);
    if (CAD_HAS_FIELD(cad_attention_backward_args_v1_t, args, saved) && args->saved != nullptr) {
      fail(CAD_STATUS_INVALID_ARGUMENT, "backward: saved is not NULL, but this backend's forward keeps no state");
    }
    check_device_ids(args, {{args->o, "o"}, {args->lse, "lse"}, {args->d_o, "d_o"}, {args->d_q, "d_q"},
                            {args->d_k, "d_k"}, {args->d_v, "d_v"}});
    const auto start = std::chrono::steady_clock::now();
    if (self.inner_runs(Direction::Backward)) {
      call_inner(self, self.inner->table->backward, normalised(&given, s), plan, "backward");
    } else {
      call_back(self, self.table().backward, normalised(&given, s), "backward");
    }
    self.backward_ms = elapsed_ms(start);
    ++self.backward_calls;
  });
}

cad_status_t get_stats_json(void* ctx, char* buffer, size_t capacity, size_t* needed) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    // Host wall time of the last calls: a CUDA callback's enqueue time, not its kernels'.
    const std::string inner =
        self.inner ? format(", \"inner\": \"%s\", \"inner_runs\": \"%s\"", self.inner->name.c_str(),
                            cad::callback_attention::direction_name(self.inner->runs))
                   : std::string();
    const std::string json = format("{\"key\": \"%s\"%s, \"forward_ms\": %.6f, \"backward_ms\": %.6f, "
                                    "\"forward_calls\": %lld, \"backward_calls\": %lld}",
                                    self.registration->key.c_str(), inner.c_str(), self.forward_ms, self.backward_ms,
                                    static_cast<long long>(self.forward_calls),
                                    static_cast<long long>(self.backward_calls));
    cad::plugin::write_json_result(json, buffer, capacity, needed);
  });
}

// Plans exist for the inner instance's sake (its work lists made once, as CAD makes them for its server backend):
// without an inner instance that makes plans, make_plan succeeds with a NULL plan, i.e. "no plan": the calls then
// carry their segment table, which is all a callback needs.
cad_status_t make_plan(void* ctx, const cad_attention_plan_args_v1_t* args, void** out_plan) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CallbackContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    if (args == nullptr || out_plan == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "make_plan: args or out_plan is NULL");
    if (args->struct_size < CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE) {
      fail(CAD_STATUS_ABI_MISMATCH, format("make_plan: args.struct_size is %zu, ABI v1.1 needs at least %d",
                                           args->struct_size, CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE));
    }
    if (args->num_pieces != 0 || args->pieces != nullptr) {
      fail(CAD_STATUS_UNSUPPORTED, "make_plan: the callback_attention backend takes segments, not pieces");
    }
    if (args->num_segments < 0 || (args->num_segments > 0 && args->segments == nullptr)) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("make_plan: %lld segments at %p", static_cast<long long>(args->num_segments),
                                               static_cast<const void*>(args->segments)));
    }
    if (!self.inner || !self.inner->has_plans()) {
      *out_plan = nullptr;
      return;
    }
    auto plan = std::make_unique<CallbackPlan>();
    plan->segments.assign(args->segments, args->segments + args->num_segments);
    if (self.inner->table->make_plan(self.inner->instance, args, &plan->inner_plan) != CAD_STATUS_OK) {
      fail(CAD_STATUS_INTERNAL, format("make_plan: inner instance '%s' failed: %s", self.inner->name.c_str(),
                                       self.inner->last_error().c_str()));
    }
    std::lock_guard<std::mutex> lock(self.plans_mutex);
    *out_plan = plan.get();
    self.plans.emplace(plan.get(), plan.get());
    plan.release();
  });
}

void release_plan(void* ctx, void* handle) {
  if (ctx == nullptr || handle == nullptr) return;
  CallbackContext& self = *as_context(ctx);
  CallbackPlan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(self.plans_mutex);
    const auto it = self.plans.find(handle);
    if (it == self.plans.end()) {
      // Never read through a handle that is not ours: say so and free nothing.
      self.error.set(format("release_plan: plan %p is not a live plan of this instance", handle));
      self.logger.log(CAD_LOG_ERROR, self.error.text());
      return;
    }
    plan = it->second;
    self.plans.erase(it);
  }
  if (plan->inner_plan != nullptr) self.inner->table->release_plan(self.inner->instance, plan->inner_plan);
  delete plan;
}

// The forward keeps nothing (*saved = NULL), so there is never a saved handle to release.
void release_saved(void*, void*) {}

const cad_attention_v1_t kAttentionTable = {
    sizeof(cad_attention_v1_t), create, destroy,    last_error,   get_capabilities, forward,
    backward,                   get_stats_json, make_plan, release_plan, release_saved,
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_ATTENTION,
    kName,
    "1.0.0",
    "attention through forward/backward functions the host process registers under a key (e.g. the Python "
    "package's torch or FlashAttention-4 server backends)",
    &kAttentionTable,
    nullptr,
    nullptr,
};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
