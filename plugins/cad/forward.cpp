// forward.cpp -- one CAD forward, on the call path both directions share (call.h): find or make the plan, run it on
// its data path (CPU: cpu_path.cpp; CUDA: device_path.cpp), keep the server batch for the backward where asked.
#include "call.h"

namespace cad::cad_plugin {

void run_forward(CadContext& ctx, const cad_attention_forward_args_v1_t* args) {
  Stopwatch total;
  const bool v11 = args != nullptr && CAD_HAS_FIELD(cad_attention_forward_args_v1_t, args, saved);
  void* const plan_handle = v11 ? args->plan : nullptr;
  CadPlan* given = nullptr;  // plan_handle once it is known to be live on this instance
  void** saved_slot = v11 ? args->saved : nullptr;
  // A forward starts a new step: the statistics of the previous backward no longer describe it.
  ctx.stats.forward = CallStats{};
  ctx.stats.backward = CallStats{};

  LocalCall local = open_call(ctx, kForward);
  try {
    given = live_plan(ctx, plan_handle, "forward");
    if (given != nullptr) local.ticket.documents = given->stamp.documents;
    local.shape = check_forward_args(args, ctx.accepts, planned_tokens(given));
    local.ticket.softmax_scale = local.shape.softmax_scale;
    local.num_pieces = args->num_pieces;
    check_call_fits(given, local, args->pieces, args->num_pieces, args->stream, "forward");
  } catch (const plugin::Failure& f) {
    refuse(local, f);
  }

  PlanPtr one_shot(nullptr, PlanDeleter{&ctx});
  CadPlan* plan = given;
  if (plan_handle == nullptr) {
    // No plan: this call plans for itself (collective: also agrees on every rank's arguments). A v1.0-style
    // forward starts a new step: what the previous one kept is stale from here on.
    if (saved_slot == nullptr) ctx.last_forward.reset();
    one_shot = make_cad_plan(ctx, *ctx.comm, local, args->pieces, args->stream, "forward", false);
    plan = one_shot.get();
  } else {
    agree_on_planned_call(ctx, local, given, args, "forward");
  }
  CallStats stats = plan_stats(*plan, /*replanned=*/plan_handle == nullptr);
  const CallShape shape = call_shape(*plan, local);

  // Keep the server batch for backward: into the caller's `saved` handle, or (v1.0-style calls) the
  // instance's last forward.
  const bool keep = ctx.config.keep_forward_tensors && (saved_slot != nullptr || given == nullptr);
  std::unique_ptr<Saved> saved = keep ? std::make_unique<Saved>() : nullptr;
  if (saved) saved->stamp = SavedStamp{plan->stamp, local.ticket.call, local.shape.softmax_scale};
  run_on_path(ctx, *plan, shape, args, saved.get(), stats);
  close_call(ctx, *plan, given != nullptr, total, stats, ctx.stats.forward, "forward");

  if (saved_slot != nullptr) {
    if (saved) ctx.saved_handles.add(saved.get());
    *saved_slot = saved.release();
  } else if (given == nullptr) {
    auto last = std::make_unique<LastForward>();
    last->plan = std::move(one_shot);
    last->saved = std::move(saved);
    ctx.last_forward = std::move(last);
  }
}

}  // namespace cad::cad_plugin
