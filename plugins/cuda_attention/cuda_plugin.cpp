// cuda_plugin.cpp -- the "cuda" attention backend (cad_cuda.so): ABI glue around the project's CUDA
// kernels (kernels/cad_kernels.h). The host-side plan (work lists) is built from the segment table,
// copied into a workspace lent by the host's allocate service, and the kernels are enqueued on the
// caller's stream; nothing here synchronises the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "cad_kernels.h"
#include "device_scope.h"
#include "host_staging.h"
#include "cad_plugin_v1.h"
#include "cuda_validate.h"
#include "plugin_support.h"

namespace {

using cad::plugin::fail;
using cad::plugin::format;

constexpr const char* kName = "cuda";
constexpr int kMinComputeCapability = 80;

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    fail(CAD_STATUS_DEVICE_ERROR, format("cuda backend: %s failed: %s (%s)", what, cudaGetErrorName(err),
                                         cudaGetErrorString(err)));
  }
}

// Makes `device` current for the scope of one call (kernels/device_scope.h); a failure to switch throws.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : scope_(device) { check_cuda(scope_.error(), "selecting the CUDA device"); }

 private:
  cad::kernels::DeviceScope scope_;
};

struct CudaContext {
  CudaContext(const cad_host_services_v1_t* host, const char* config_json) : logger(host, kName), services(host) {
    cad::plugin::ConfigReader config(config_json, "plugin 'cuda' config");
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      fail(CAD_STATUS_DEVICE_ERROR, format("cuda backend: no usable CUDA device (%s)",
                                           err != cudaSuccess ? cudaGetErrorString(err) : "device count is 0"));
    }
    int current = 0;
    check_cuda(cudaGetDevice(&current), "cudaGetDevice");
    device = static_cast<int>(config.get_int("device", current, 0, count - 1));
    const bool allow_hopper = config.get_bool("hopper_kernels", true);
    // SMs the persistent forward kernel leaves free (its grid is the rest): for an instance whose work runs beside
    // a collective (CAD's own tasks while their rows are in flight), so that the collective's kernel never waits
    // for all of it. Bounded below by 1 SM used.
    const int64_t reserve_sms = config.get_int("reserve_sms", 0, 0, 1024);
    // The Hopper forward's walk over its units (ForwardPlan::dynamic_walk): "static" (a fixed share per block, what
    // the planner and `cad simulate` model) or "dynamic" (each block takes the next untaken unit), for an instance
    // whose forward shares the GPU with a collective: its late blocks then take fewer units.
    dynamic_walk = config.get_choice("forward_walk", "static", {"static", "dynamic"}) == "dynamic";
    config.finish(logger);
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    compute_capability = prop.major * 10 + prop.minor;
    num_sms = std::max(1, prop.multiProcessorCount - static_cast<int>(reserve_sms));
    device_name = prop.name;
    if (compute_capability < kMinComputeCapability) {
      fail(CAD_STATUS_UNSUPPORTED, format("cuda backend: device %d (%s) has compute capability %d.%d; needs 8.0 or newer",
                                          device, prop.name, prop.major, prop.minor));
    }
    {
      DeviceScope scope(device);
      hopper = allow_hopper && cad::kernels::hopper_kernels_available();
      last_forward_hopper = hopper;
    }
    logger.info(format("device %d: %s, sm_%d, %d SMs (%d used by the persistent forward, %s walk), %s forward kernel",
                       device, prop.name, compute_capability, prop.multiProcessorCount, num_sms,
                       dynamic_walk ? "dynamic" : "static", hopper ? "wgmma (sm_90a)" : "mma.sync"));
  }

  // Workspace lent by the host for one call, handed back in stream order when the call's work is enqueued.
  class Workspace {
   public:
    Workspace(const CudaContext& ctx, size_t bytes, void* stream) : ctx_(ctx), stream_(stream) {
      const cad_device_v1_t dev{CAD_DEVICE_CUDA, ctx.device};
      if (bytes == 0) return;
      const cad_status_t st = ctx.services->allocate(ctx.services->host_ctx, dev, bytes, stream, &ptr_);
      if (st != CAD_STATUS_OK || ptr_ == nullptr) {
        ptr_ = nullptr;
        fail(CAD_STATUS_OUT_OF_MEMORY, format("cuda backend: the host could not allocate a workspace of %zu bytes", bytes));
      }
    }
    ~Workspace() {
      if (ptr_ != nullptr) ctx_.services->free(ctx_.services->host_ctx, {CAD_DEVICE_CUDA, ctx_.device}, ptr_, stream_);
    }
    Workspace(const Workspace&) = delete;
    Workspace& operator=(const Workspace&) = delete;
    void* get() const { return ptr_; }

   private:
    const CudaContext& ctx_;
    void* stream_;
    void* ptr_ = nullptr;
  };

  cad::plugin::ErrorState error;
  cad::plugin::Logger logger;
  const cad_host_services_v1_t* services;
  int device = 0;
  int compute_capability = 0;
  int num_sms = 1;
  bool dynamic_walk = false;  // config "forward_walk"; every forward plan of this instance gets it
  bool hopper = false;  // forward on the sm_90a wgmma kernel (config "hopper_kernels", default true, where loaded)
  std::string device_name;
  // Statistics of the last successful call.
  size_t last_items = 0, last_splits = 0, last_workspace_bytes = 0;
  bool last_kv_exclusive = true;
  bool last_backward_hopper = false;  // which kernels the last backward ran (with a plan or without)
  bool last_forward_hopper = false;   // and the last forward (before any: `hopper`)
  // Pinned buffers the tables go up through, a plan's (make_plan) and a call's without a plan: a copy from
  // pageable memory may wait for its stream to drain (host_staging.h), which would stop a plan made ahead on its
  // thread, and the training thread at every local attention call, until the GPU had caught up.
  cad::kernels::HostStaging staging;
};

CudaContext* as_context(void* ctx) { return static_cast<CudaContext*>(ctx); }

const cad::kernels::Segment* as_segments(const cad_segment_v1_t* s) {
  static_assert(sizeof(cad::kernels::Segment) == sizeof(cad_segment_v1_t), "segment layouts must match");
  return reinterpret_cast<const cad::kernels::Segment*>(s);
}

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                    char* error_message, size_t error_capacity) {
  return cad::plugin::create_context<CudaContext>(services, config_json, out_ctx, error_message, error_capacity);
}

void destroy(void* ctx) { delete as_context(ctx); }  // no thread, no pending state: work belongs to the caller's stream

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
    out->device_type = CAD_DEVICE_CUDA;
    out->dtype_mask = CAD_ATTENTION_DTYPE_BF16;
    out->flags = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA |
                 CAD_ATTENTION_CAP_SHARED_KV | CAD_ATTENTION_CAP_BACKWARD | CAD_ATTENTION_CAP_WINDOW;
    out->head_dim_mask = (1u << 3) | (1u << 7);  // 64 and 128
    out->max_head_dim = 128;
    out->min_compute_capability = kMinComputeCapability;
  });
}

// A plan (ABI v1.1): the work lists of one segment table, their device tables uploaded once into
// workspaces the plan keeps, so that a call made with it only enqueues kernels (graph capturable).
// A plan keeps its uploaded work lists only: the first `*_tables_bytes` of the kernels' workspace layout
// (cad_kernels.h puts the tables first). The rest of the workspace (split-KV partials, the backward's
// fp32 accumulators: up to 1.5x the size of dQ) is scratch, taken per call like an unplanned call's, so that
// plans held ahead or by other micro-batches do not pin it.
struct CudaPlan {
  cad::kernels::ForwardPlan forward;
  cad::kernels::BackwardPlan backward;
  std::vector<cad_segment_v1_t> segments;
  // The window make_plan was given, which the calls must give too (the kernels' plans drop one that hides no
  // key of the segments: their problem's window may be none).
  int32_t window_left = -1, window_right = -1;
  void* forward_tables = nullptr;
  void* backward_tables = nullptr;
  size_t forward_tables_bytes = 0, backward_tables_bytes = 0;
  void* stream = nullptr;  // the stream the tables were allocated on (and go back on)
};

void free_plan(CudaContext& self, CudaPlan* plan) {
  if (plan == nullptr) return;
  const cad_device_v1_t dev{CAD_DEVICE_CUDA, self.device};
  if (plan->forward_tables != nullptr) self.services->free(self.services->host_ctx, dev, plan->forward_tables, plan->stream);
  if (plan->backward_tables != nullptr) {
    self.services->free(self.services->host_ctx, dev, plan->backward_tables, plan->stream);
  }
  delete plan;
}

void* allocate_for_plan(CudaContext& self, size_t bytes, void* stream, const char* what) {
  void* ptr = nullptr;
  if (bytes == 0) return nullptr;
  const cad_status_t st = self.services->allocate(self.services->host_ctx, {CAD_DEVICE_CUDA, self.device}, bytes, stream, &ptr);
  if (st != CAD_STATUS_OK || ptr == nullptr) {
    fail(CAD_STATUS_OUT_OF_MEMORY, format("cuda backend: make_plan: the host could not allocate the %s workspace of %zu bytes",
                                          what, bytes));
  }
  return ptr;
}

cad_status_t make_plan(void* ctx, const cad_attention_plan_args_v1_t* args, void** out_plan) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CudaContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    if (args == nullptr || out_plan == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "make_plan: args or out_plan is NULL");
    if (args->struct_size < CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE) {  // the v1.2 window is read only when present
      fail(CAD_STATUS_ABI_MISMATCH, format("make_plan: args.struct_size is %zu, expected >= %zu", args->struct_size,
                                           static_cast<size_t>(CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE)));
    }
    const cad::kernels::AttentionProblem pr = cad::cuda_backend::check_plan(args, self.device);
    auto plan = std::unique_ptr<CudaPlan, std::function<void(CudaPlan*)>>(
        new CudaPlan, [&self](CudaPlan* p) { free_plan(self, p); });
    cad::kernels::AttentionProblem problem = pr;
    problem.hopper = self.hopper;
    plan->segments.assign(args->segments, args->segments + args->num_segments);
    plan->window_left = pr.window_left;
    plan->window_right = pr.window_right;
    plan->forward = cad::kernels::make_forward_plan(problem, as_segments(args->segments), args->num_segments, self.num_sms);
    plan->forward.dynamic_walk = self.dynamic_walk;
    plan->backward = cad::kernels::make_backward_plan(problem, as_segments(args->segments), args->num_segments);
    plan->stream = args->stream;
    DeviceScope scope(self.device);
    plan->forward_tables_bytes = plan->forward.partial_o_offset;  // items, combines, uncovered rows
    plan->backward_tables_bytes = plan->backward.delta_offset;    // items
    plan->forward_tables = allocate_for_plan(self, plan->forward_tables_bytes, args->stream, "forward tables");
    plan->backward_tables = allocate_for_plan(self, plan->backward_tables_bytes, args->stream, "backward tables");
    const cudaStream_t stream = static_cast<cudaStream_t>(args->stream);
    check_cuda(cad::kernels::upload_forward_tables(plan->forward, plan->forward_tables, stream, &self.staging),
               "make_plan: forward tables");
    check_cuda(cad::kernels::upload_backward_tables(plan->backward, plan->backward_tables, stream, &self.staging),
               "make_plan: backward tables");
    *out_plan = plan.release();
  });
}

void release_plan(void* ctx, void* plan) {
  if (ctx == nullptr || plan == nullptr) return;
  free_plan(*as_context(ctx), static_cast<CudaPlan*>(plan));
}

void release_saved(void*, void*) {}

// A planned call's workspace: the plan's tables, copied on the device in stream order (kilobytes to a few MB;
// capturable into a CUDA graph), then the call's own scratch after them.
void copy_tables(void* workspace, const void* tables, size_t bytes, void* stream) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(workspace, tables, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
             "copying the plan's tables into the call's workspace");
}  // forward never saves anything: its backward reads the caller's tensors

// A call given a plan must describe the batch the plan was made for.
template <class Args>
CudaPlan* plan_of(const Args* args, const cad::kernels::AttentionProblem& pr, const char* call) {
  if (!CAD_HAS_FIELD(Args, args, plan) || args->plan == nullptr) return nullptr;
  auto* plan = static_cast<CudaPlan*>(args->plan);
  const cad::kernels::AttentionProblem& p = plan->forward.problem;
  if (plan->window_left != pr.window_left || plan->window_right != pr.window_right) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: the call's window (window_left=%d, window_right=%d) is not the plan's (window_left=%d, "
                "window_right=%d)", call, pr.window_left, pr.window_right, plan->window_left, plan->window_right));
  }
  if (p.tq != pr.tq || p.tk != pr.tk || p.hq != pr.hq || p.hkv != pr.hkv || p.head_dim != pr.head_dim ||
      p.causal != pr.causal) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("%s: the tensors (Tq=%lld, Tk=%lld, Hq=%d, Hkv=%d, D=%d, causal=%d) do not match the plan's (Tq=%lld, "
                "Tk=%lld, Hq=%d, Hkv=%d, D=%d, causal=%d)", call, static_cast<long long>(pr.tq),
                static_cast<long long>(pr.tk), pr.hq, pr.hkv, pr.head_dim, pr.causal ? 1 : 0,
                static_cast<long long>(p.tq), static_cast<long long>(p.tk), p.hq, p.hkv, p.head_dim, p.causal ? 1 : 0));
  }
  if (args->num_segments != 0 &&
      (args->num_segments != static_cast<int64_t>(plan->segments.size()) ||
       std::memcmp(args->segments, plan->segments.data(), plan->segments.size() * sizeof(cad_segment_v1_t)) != 0)) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: the segment table differs from the plan's", call));
  }
  return plan;
}

cad_status_t forward(void* ctx, const cad_attention_forward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CudaContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    cad::kernels::AttentionProblem pr = cad::cuda_backend::check_forward(args, self.device);
    if (CudaPlan* plan = plan_of(args, pr, "forward")) {
      plan->forward.problem.softmax_scale = args->softmax_scale;
      DeviceScope scope(self.device);
      CudaContext::Workspace ws(self, plan->forward.workspace_bytes, args->stream);
      copy_tables(ws.get(), plan->forward_tables, plan->forward_tables_bytes, args->stream);
      check_cuda(cad::kernels::attention_forward_resident(
                     plan->forward, cad::plugin::tensor_data(args->q), cad::plugin::tensor_data(args->k),
                     cad::plugin::tensor_data(args->v), cad::plugin::tensor_data(args->o),
                     static_cast<float*>(cad::plugin::tensor_data(args->lse)), ws.get(),
                     static_cast<cudaStream_t>(args->stream)),
                 "forward launch");
      self.last_forward_hopper = plan->forward.problem.hopper;
      if (CAD_HAS_FIELD(cad_attention_forward_args_v1_t, args, saved) && args->saved != nullptr) *args->saved = nullptr;
      return;
    }
    pr.hopper = self.hopper;
    cad::kernels::ForwardPlan plan =
        cad::kernels::make_forward_plan(pr, as_segments(args->segments), args->num_segments, self.num_sms);
    plan.dynamic_walk = self.dynamic_walk;
    DeviceScope scope(self.device);
    CudaContext::Workspace ws(self, plan.workspace_bytes, args->stream);
    check_cuda(cad::kernels::attention_forward(plan, cad::plugin::tensor_data(args->q), cad::plugin::tensor_data(args->k),
                                               cad::plugin::tensor_data(args->v), cad::plugin::tensor_data(args->o),
                                               static_cast<float*>(cad::plugin::tensor_data(args->lse)), ws.get(),
                                               static_cast<cudaStream_t>(args->stream), &self.staging),
               "forward launch");
    self.last_items = plan.items.size();
    self.last_splits = plan.combines.size();
    self.last_workspace_bytes = plan.workspace_bytes;
    self.last_forward_hopper = plan.problem.hopper;
  });
}

cad_status_t backward(void* ctx, const cad_attention_backward_args_v1_t* args) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CudaContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    cad::kernels::AttentionProblem pr = cad::cuda_backend::check_backward(args, self.device);
    if (CudaPlan* resident = plan_of(args, pr, "backward")) {
      resident->backward.problem.softmax_scale = args->softmax_scale;
      DeviceScope scope(self.device);
      CudaContext::Workspace ws(self, resident->backward.workspace_bytes, args->stream);
      copy_tables(ws.get(), resident->backward_tables, resident->backward_tables_bytes, args->stream);
      check_cuda(cad::kernels::attention_backward_resident(
                     resident->backward, cad::plugin::tensor_data(args->q), cad::plugin::tensor_data(args->k),
                     cad::plugin::tensor_data(args->v), cad::plugin::tensor_data(args->o),
                     static_cast<const float*>(cad::plugin::tensor_data(args->lse)),
                     cad::plugin::tensor_data(args->d_o), cad::plugin::tensor_data(args->d_q),
                     cad::plugin::tensor_data(args->d_k), cad::plugin::tensor_data(args->d_v), ws.get(),
                     static_cast<cudaStream_t>(args->stream)),
                 "backward launch");
      self.last_backward_hopper = resident->backward.problem.hopper;
      return;
    }
    pr.hopper = self.hopper;  // the same kernels as the forward (and as a planned call)
    const cad::kernels::BackwardPlan plan =
        cad::kernels::make_backward_plan(pr, as_segments(args->segments), args->num_segments);
    DeviceScope scope(self.device);
    CudaContext::Workspace ws(self, plan.workspace_bytes, args->stream);
    check_cuda(cad::kernels::attention_backward(
                   plan, cad::plugin::tensor_data(args->q), cad::plugin::tensor_data(args->k),
                   cad::plugin::tensor_data(args->v), cad::plugin::tensor_data(args->o),
                   static_cast<const float*>(cad::plugin::tensor_data(args->lse)), cad::plugin::tensor_data(args->d_o),
                   cad::plugin::tensor_data(args->d_q), cad::plugin::tensor_data(args->d_k),
                   cad::plugin::tensor_data(args->d_v), ws.get(), static_cast<cudaStream_t>(args->stream),
                   &self.staging),
               "backward launch");
    self.last_items = plan.items.size();
    self.last_splits = 0;
    self.last_workspace_bytes = plan.workspace_bytes;
    self.last_kv_exclusive = plan.kv_exclusive;
    self.last_backward_hopper = plan.problem.hopper;
  });
}

cad_status_t get_stats_json(void* ctx, char* buffer, size_t capacity, size_t* needed) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  CudaContext& self = *as_context(ctx);
  return cad::plugin::guarded(self.error, [&] {
    nlohmann::json j;
    j["device"] = self.device;
    j["device_name"] = self.device_name;
    j["compute_capability"] = self.compute_capability;
    j["forward_kernel"] = self.last_forward_hopper ? "wgmma_sm90a" : "mma_sync";
    j["backward_kernel"] = self.last_backward_hopper ? "wgmma_sm90a" : "mma_sync";
    j["work_items"] = self.last_items;
    j["kv_split_tiles"] = self.last_splits;
    j["workspace_bytes"] = self.last_workspace_bytes;
    j["kv_exclusive"] = self.last_kv_exclusive;
    cad::plugin::write_json_result(j.dump(), buffer, capacity, needed);
  });
}

const cad_attention_v1_t kAttentionTable = {
    sizeof(cad_attention_v1_t), create,      destroy,      last_error,    get_capabilities, forward,
    backward,                   get_stats_json, make_plan, release_plan, release_saved,
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_ATTENTION,
    kName,
    "0.1.0",
    "CUDA attention (bf16, varlen, causal, sliding windows, GQA, shared KV, split-KV, backward; head dims 64/128; "
    "sm_80+)",
    &kAttentionTable,
    nullptr,
    nullptr,
};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
