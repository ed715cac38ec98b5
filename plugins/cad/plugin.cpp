// plugin.cpp -- the ABI glue of plugin "cad": core attention disaggregation as an attention backend
// that takes pieces. Every entry point is wrapped by plugin::guarded so that no exception crosses.
#include <cstring>

#include "call.h"
#include "context.h"
#include "data_path.h"
#include "device_path.h"

namespace {

using cad::cad_plugin::CadContext;
namespace plugin = cad::plugin;

CadContext* as_ctx(void* ctx) { return static_cast<CadContext*>(ctx); }

cad_status_t null_ctx() { return CAD_STATUS_INVALID_ARGUMENT; }

cad_status_t cad_create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                        char* error_message, size_t error_capacity) {
  return plugin::create_context<CadContext>(services, config_json, out_ctx, error_message, error_capacity);
}

void cad_destroy(void* ctx) { delete as_ctx(ctx); }

const char* cad_last_error(void* ctx) {
  return ctx == nullptr ? "context is NULL" : as_ctx(ctx)->text();
}

cad_status_t cad_get_capabilities(void* ctx, cad_attention_capabilities_v1_t* out) {
  if (ctx == nullptr) return null_ctx();
  CadContext& c = *as_ctx(ctx);
  return plugin::guarded(c, [&] {
    std::lock_guard<std::recursive_mutex> lock(c.state_mutex);
    if (out == nullptr) plugin::fail(CAD_STATUS_INVALID_ARGUMENT, "get_capabilities: out is NULL");
    if (out->struct_size < sizeof(cad_attention_capabilities_v1_t)) {
      plugin::fail(CAD_STATUS_ABI_MISMATCH,
                   plugin::format("get_capabilities: out->struct_size is %zu, expected >= %zu", out->struct_size,
                                  sizeof(cad_attention_capabilities_v1_t)));
    }
    const size_t size = out->struct_size;
    *out = cad_capabilities(c);
    out->struct_size = size;
  });
}

cad_status_t cad_forward(void* ctx, const cad_attention_forward_args_v1_t* args) {
  if (ctx == nullptr) return null_ctx();
  CadContext& c = *as_ctx(ctx);
  return plugin::guarded(c, [&] {
    std::lock_guard<std::recursive_mutex> lock(c.state_mutex);
    cad::cad_plugin::run_call(c, cad::cad_plugin::CallArgs::of(args));
  });
}

cad_status_t cad_backward(void* ctx, const cad_attention_backward_args_v1_t* args) {
  if (ctx == nullptr) return null_ctx();
  CadContext& c = *as_ctx(ctx);
  return plugin::guarded(c, [&] {
    std::lock_guard<std::recursive_mutex> lock(c.state_mutex);
    cad::cad_plugin::run_call(c, cad::cad_plugin::CallArgs::of(args));
  });
}

cad_status_t cad_get_stats_json(void* ctx, char* buffer, size_t capacity, size_t* needed) {
  if (ctx == nullptr) return null_ctx();
  CadContext& c = *as_ctx(ctx);
  return plugin::guarded(c, [&] {
    std::lock_guard<std::recursive_mutex> lock(c.state_mutex);
    cad::cad_plugin::harvest_gpu_times(c);
    c.stats.rank = c.comm->rank();
    c.stats.world = c.comm->world();
    plugin::write_json_result(cad::cad_plugin::stats_json(c.stats), buffer, capacity, needed);
  });
}

cad_status_t cad_make_plan(void* ctx, const cad_attention_plan_args_v1_t* args, void** out_plan) {
  if (ctx == nullptr) return null_ctx();
  CadContext& c = *as_ctx(ctx);
  return plugin::guarded(c, [&] {
    // With a plan communicator this may run on a thread of its own while another thread runs forward and
    // backward (a plan made ahead): see CadContext's thread-safety note. Without one, it is an ordinary call.
    std::lock_guard<std::mutex> one_make_at_a_time(c.planning_mutex);
    const bool concurrent = c.plans_concurrently();
    std::unique_lock<std::recursive_mutex> state(c.state_mutex, std::defer_lock);
    if (!concurrent) state.lock();
    cad::cad_plugin::LocalCall local;
    local.head_groups = c.config.head_groups;
    try {
      if (out_plan == nullptr) plugin::fail(CAD_STATUS_INVALID_ARGUMENT, "make_plan: out_plan is NULL");
      local.shape = cad::cad_plugin::check_plan_args(args, c.accepts);
      local.num_pieces = args->num_pieces;
    } catch (const plugin::Failure& f) {
      local.status = f.status();
      local.message = f.what();
    }
    // Collective: every rank reaches the same verdict (a rank whose arguments are bad fails them all).
    cad::cad_plugin::PlanPtr plan =
        cad::cad_plugin::make_cad_plan(c, c.planning_comm(), local, args != nullptr ? args->pieces : nullptr,
                                       args != nullptr ? args->stream : nullptr, "make_plan", concurrent);
    if (concurrent) state.lock();
    // What the plan will do, readable at once (get_stats_json's "plan"), before any call uses it.
    c.stats.plan = plan->model;
    c.stats.plan.valid = true;
    if (plan->device) c.stats.plan.workspace_bytes = cad::cad_plugin::device_plan_bytes(*plan->device);
    c.plan_handles.add(plan.get());
    *out_plan = plan.release();
  });
}

// The release functions return nothing (ABI v1.1), so a handle that is not live on this instance (released
// already, or another instance's) is refused the only way left: an error logged and kept as last_error, and
// nothing freed. The pointer is never dereferenced.
void refuse_release(CadContext& c, const std::string& message) {
  c.set(message);
  c.logger.log(CAD_LOG_ERROR, message);
}

void cad_release_plan(void* ctx, void* plan) {
  if (ctx == nullptr || plan == nullptr) return;
  CadContext& c = *as_ctx(ctx);
  std::lock_guard<std::recursive_mutex> lock(c.state_mutex);
  if (!c.plan_handles.remove(plan)) return refuse_release(c, c.plan_handles.not_live(plan, "release_plan"));
  cad::cad_plugin::PlanDeleter{&c}(static_cast<cad::cad_plugin::CadPlan*>(plan));
}

void cad_release_saved(void* ctx, void* saved) {
  if (ctx == nullptr || saved == nullptr) return;
  CadContext& c = *as_ctx(ctx);
  std::lock_guard<std::recursive_mutex> lock(c.state_mutex);
  if (!c.saved_handles.remove(saved)) return refuse_release(c, c.saved_handles.not_live(saved, "release_saved"));
  delete static_cast<cad::cad_plugin::Saved*>(saved);
}

const cad_attention_v1_t kAttentionTable = {
    sizeof(cad_attention_v1_t), cad_create,       cad_destroy,      cad_last_error, cad_get_capabilities, cad_forward,
    cad_backward,               cad_get_stats_json, cad_make_plan, cad_release_plan, cad_release_saved,
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_ATTENTION,
    "cad",
    "0.1.0",
    "core attention disaggregation: balances attention work across ranks (CPU data path over any "
    "communicator, balancer and server backend)",
    &kAttentionTable,
    nullptr,
    nullptr,
};

}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
