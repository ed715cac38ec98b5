// call.cpp -- see call.h.
#include "call.h"

#include "cpu_path.h"
#include "device_path.h"

namespace cad::cad_plugin {

LocalCall open_call(CadContext& ctx, CallKind kind) {
  LocalCall local;
  local.head_groups = ctx.config.head_groups;
  local.ticket.call = ++ctx.calls;
  local.ticket.kind = kind;
  return local;
}

CadPlan* live_plan(CadContext& ctx, void* handle, const char* what) {
  if (handle == nullptr) return nullptr;
  ctx.plan_handles.check_live(handle, what);
  return static_cast<CadPlan*>(handle);
}

void check_call_fits(const CadPlan* given, const LocalCall& local, const cad_piece_v1_t* pieces, int64_t num_pieces,
                     void* stream, const char* what) {
  if (given != nullptr) check_call_matches_plan(*given, local.shape, pieces, num_pieces, what);
  if (local.shape.device_type == CAD_DEVICE_CUDA) check_call_stream(stream, local.shape.device_id, what);
}

void refuse(LocalCall& local, const plugin::Failure& failure) {
  local.status = failure.status();
  local.message = failure.what();
}

void agree_on_planned_call(CadContext& ctx, const LocalCall& local, CadPlan* given,
                           const cad_attention_forward_args_v1_t* args, const char* what) {
  std::function<void()> drain;  // none without a live plan: nothing tells this rank the collectives' sizes
  if (given != nullptr) {
    drain = [&] {
      CallStats ignored;
      device_forward(ctx, *given, given->step.shape, args, nullptr, ignored, /*drain=*/true);
    };
  }
  agree_on_plan_call(ctx, local, what, drain);
}

void agree_on_planned_call(CadContext& ctx, const LocalCall& local, CadPlan* given,
                           const cad_attention_backward_args_v1_t* args, const char* what) {
  std::function<void()> drain;  // as the forward's
  if (given != nullptr) {
    drain = [&] {
      CallStats ignored;
      device_backward(ctx, *given, given->step.shape, args, nullptr, ignored, /*drain=*/true);
    };
  }
  agree_on_plan_call(ctx, local, what, drain);
}

CallStats plan_stats(const CadPlan& plan, bool replanned) {
  CallStats stats = plan.model;
  stats.replanned = replanned;
  if (!replanned) stats.plan_ms = 0.0;
  return stats;
}

CallShape call_shape(const CadPlan& plan, const LocalCall& local) {
  CallShape shape = plan.step.shape;
  shape.softmax_scale = local.shape.softmax_scale;
  return shape;
}

void run_on_path(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_forward_args_v1_t* args,
                 Saved* keep, CallStats& stats) {
  if (plan.device) {
    device_forward(ctx, plan, shape, args, keep, stats);
  } else {
    cpu_forward(ctx, plan, shape, args, keep, stats);
  }
}

void run_on_path(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_backward_args_v1_t* args,
                 Saved* saved, CallStats& stats) {
  if (plan.device) {
    device_backward(ctx, plan, shape, args, saved, stats);
  } else {
    cpu_backward(ctx, plan, shape, args, saved, stats);
  }
}

void close_call(CadContext& ctx, const CadPlan& plan, bool planned, Stopwatch& total, CallStats& stats, CallStats& slot,
                const char* what) {
  if (!planned && plan.device == nullptr) gather_bytes(*ctx.comm, stats);
  stats.total_ms = total.lap_ms();
  stats.valid = true;
  slot = stats;
  if (ctx.logger.enabled(CAD_LOG_DEBUG)) ctx.logger.debug(stats_line(what, stats, ctx.comm->rank()));
}

}  // namespace cad::cad_plugin
