// backward.cpp -- one CAD backward, on the call path both directions share (call.h): find the plan (given, the last
// forward's, or a one-shot plan) and the forward's kept state, and run it on its data path (CPU: cpu_path.cpp;
// CUDA: device_path.cpp): dO (and, unless the servers kept them, Q/K/V/O/LSE) to the servers, the server batch's
// backward, dQ back to the query owners and partial dK/dV back to the key/value owners.
#include <cstring>

#include "call.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

namespace {

bool same_shape(const CallShape& a, const CallShape& b) {
  return a.tokens == b.tokens && a.num_q_heads == b.num_q_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.bf16 == b.bf16 && a.causal == b.causal && a.window_left == b.window_left &&
         a.device_type == b.device_type && a.device_id == b.device_id;
}

// v1.0-style calls: does this backward follow the instance's last forward (same pieces and shape, and the
// same softmax_scale where it kept the forward's LSE)?
bool matches(const LastForward* last, const CallShape& shape, const cad_piece_v1_t* pieces, int64_t num_pieces) {
  if (last == nullptr || !same_shape(last->plan->step.shape, shape)) return false;
  if (last->saved != nullptr && last->saved->stamp.softmax_scale != shape.softmax_scale) return false;
  const std::vector<cad_piece_v1_t>& mine = last->plan->local_pieces;
  if (static_cast<int64_t>(mine.size()) != num_pieces) return false;
  return num_pieces == 0 || std::memcmp(mine.data(), pieces, static_cast<size_t>(num_pieces) * sizeof(cad_piece_v1_t)) == 0;
}

}  // namespace

void run_backward(CadContext& ctx, const cad_attention_backward_args_v1_t* args) {
  Stopwatch total;
  Comm& comm = *ctx.comm;
  const bool v11 = args != nullptr && CAD_HAS_FIELD(cad_attention_backward_args_v1_t, args, saved);
  void* const plan_handle = v11 ? args->plan : nullptr;
  void* const saved_handle = v11 ? args->saved : nullptr;
  CadPlan* given = nullptr;  // the handles, once known to be live on this instance
  Saved* saved = nullptr;
  ctx.stats.backward = CallStats{};

  LocalCall local = open_call(ctx, kBackward);
  try {
    given = live_plan(ctx, plan_handle, "backward");
    if (saved_handle != nullptr) {
      ctx.saved_handles.check_live(saved_handle, "backward");
      saved = static_cast<Saved*>(saved_handle);
    }
    local.shape = check_backward_args(args, ctx.accepts, planned_tokens(given));
    local.num_pieces = args->num_pieces;
    check_call_fits(given, local, args->pieces, args->num_pieces, args->stream, "backward");
    if (saved != nullptr) {
      check_saved_fits(saved->stamp, given != nullptr ? &given->stamp : nullptr, local.shape,
                       pieces_fingerprint(args->pieces, args->num_pieces), "backward");
      local.ticket.saved_forward = saved->stamp.forward_call;
    }
    local.ticket.documents =
        given != nullptr ? given->stamp.documents : saved != nullptr ? saved->stamp.plan.documents : 0;
    local.ticket.softmax_scale = local.shape.softmax_scale;
    // With a plan, keeping is the caller's choice per forward (it passed `saved` or not): a backward without
    // saved state re-sends Q/K/V/O/LSE from the owners, whatever keep_forward_tensors says.
    local.matches_last_forward = matches(ctx.last_forward.get(), local.shape, args->pieces, args->num_pieces);
  } catch (const plugin::Failure& f) {
    refuse(local, f);
  }

  PlanPtr one_shot(nullptr, PlanDeleter{&ctx});
  CadPlan* plan = given;
  if (plan_handle != nullptr) {
    agree_on_planned_call(ctx, local, given, args, "backward");
  } else {
    const AgreedCall call = agree_on_call(comm, local, "backward");
    const bool reuse = saved == nullptr && call.first_rank_not_matching < 0;
    if (saved == nullptr && ctx.config.keep_forward_tensors && !reuse) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("backward: rank %d's pieces, shapes or softmax_scale differ from its last forward (or it ran "
                  "none); with keep_forward_tensors true the servers hold only the last forward's Q/K/V/O/LSE, so "
                  "backward must follow that forward with the same pieces and tensors on every rank",
                  call.first_rank_not_matching));
    }
    if (reuse) {
      plan = ctx.last_forward->plan.get();
      if (saved == nullptr) saved = ctx.last_forward->saved.get();
    } else {
      one_shot = make_cad_plan(ctx, *ctx.comm, call, local.num_pieces, args->pieces, args->stream, false);
      plan = one_shot.get();
      // The same verdict on every rank: their states' documents were agreed on, the plan is the same everywhere.
      if (saved != nullptr) check_saved_documents(saved->stamp, plan->stamp.documents, "backward");
    }
  }
  CallStats stats = plan_stats(*plan, /*replanned=*/one_shot != nullptr);
  run_on_path(ctx, *plan, call_shape(*plan, local), args, saved, stats);
  close_call(ctx, *plan, given != nullptr, total, stats, ctx.stats.backward, "backward");
}

}  // namespace cad::cad_plugin
