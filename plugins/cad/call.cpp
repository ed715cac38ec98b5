// call.cpp -- see call.h: open, validate, agree, dispatch, close, once for both directions.
#include "call.h"

#include <cstring>
#include <functional>
#include <memory>

#include "cpu_path.h"
#include "data_path.h"
#include "device_path.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

namespace {

bool same_shape(const CallShape& a, const CallShape& b) {
  return a.tokens == b.tokens && a.num_q_heads == b.num_q_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.bf16 == b.bf16 && a.causal == b.causal && a.window_left == b.window_left &&
         a.device_type == b.device_type && a.device_id == b.device_id;
}

// v1.0-style backwards: does this backward follow the instance's last forward (same pieces and shape, and the
// same softmax_scale where it kept the forward's LSE)?
bool matches(const LastForward* last, const CallShape& shape, const cad_piece_v1_t* pieces, int64_t num_pieces) {
  if (last == nullptr || !same_shape(last->plan->step.shape, shape)) return false;
  if (last->saved != nullptr && last->saved->stamp.softmax_scale != shape.softmax_scale) return false;
  const std::vector<cad_piece_v1_t>& mine = last->plan->local_pieces;
  if (static_cast<int64_t>(mine.size()) != num_pieces) return false;
  return num_pieces == 0 || std::memcmp(mine.data(), pieces, static_cast<size_t>(num_pieces) * sizeof(cad_piece_v1_t)) == 0;
}

// The plan behind `handle`, once it is known to be live on this instance (throws INVALID_ARGUMENT otherwise); NULL
// for a NULL handle (a call without a plan).
CadPlan* live_plan(CadContext& ctx, void* handle, const char* what) {
  if (handle == nullptr) return nullptr;
  ctx.plan_handles.check_live(handle, what);
  return static_cast<CadPlan*>(handle);
}

// One call's state through the path: what it was given and what it runs with.
struct Call {
  explicit Call(const CallArgs& a) : args(a), what(a.what()) {}
  const CallArgs& args;
  const char* what;
  CadPlan* given = nullptr;   // the plan handle, once known to be live
  Saved* saved = nullptr;     // backward: the saved handle once known to be live (or the last forward's)
  LocalCall local;
};

// 2. validate: the rank-local checks; the verdict goes into call.local (not thrown: the ranks agree first).
void validate(CadContext& ctx, Call& call) {
  const CallArgs& a = call.args;
  try {
    call.given = live_plan(ctx, a.plan(), call.what);
    if (a.kind == kForward && call.given != nullptr) call.local.ticket.documents = call.given->stamp.documents;
    void* const saved_handle = a.kind == kBackward && a.v11() ? a.backward->saved : nullptr;
    if (saved_handle != nullptr) {
      ctx.saved_handles.check_live(saved_handle, call.what);
      call.saved = static_cast<Saved*>(saved_handle);
    }
    const CadPlan* given = call.given;
    if (given != nullptr) {
      const PlanFixed fixed{given->step.shape, given->local_pieces, given->stamp.serial};
      call.local.shape = check_call(a, ctx.accepts, &fixed);
    } else {
      call.local.shape = check_call(a, ctx.accepts, nullptr);
    }
    call.local.num_pieces = a.num_pieces();
    if (call.local.shape.device_type == CAD_DEVICE_CUDA) {
      check_call_stream(a.stream(), call.local.shape.device_id, call.what);
    }
    if (a.kind == kBackward) {
      if (call.saved != nullptr) {
        check_saved_fits(call.saved->stamp, given != nullptr ? &given->stamp : nullptr, call.local.shape,
                         pieces_fingerprint(a.pieces(), a.num_pieces()), call.what);
        call.local.ticket.saved_forward = call.saved->stamp.forward_call;
      }
      call.local.ticket.documents = given != nullptr         ? given->stamp.documents
                                    : call.saved != nullptr ? call.saved->stamp.plan.documents
                                                            : 0;
      // With a plan, keeping is the caller's choice per forward (it passed `saved` or not): a backward without
      // saved state re-sends Q/K/V/O/LSE from the owners, whatever keep_forward_tensors says.
      call.local.matches_last_forward = matches(ctx.last_forward.get(), call.local.shape, a.pieces(), a.num_pieces());
    }
    call.local.ticket.softmax_scale = call.local.shape.softmax_scale;
  } catch (const plugin::Failure& f) {
    call.local.status = f.status();
    call.local.message = f.what();
  }
}

// The direction's data path on the plan's device. Forward: `saved` receives the server batch for the backward, or
// is NULL. Backward: `saved` is that state, or NULL (the owners re-send it). `drain` (CUDA): this rank's call is
// invalid; its collectives run on scratch buffers so that no peer waits forever.
void dispatch(CadContext& ctx, CadPlan& plan, const CallShape& shape, const CallArgs& a, Saved* saved, CallStats& stats,
              bool drain = false) {
  if (a.kind == kForward) {
    if (plan.device) {
      device_forward(ctx, plan, shape, a.forward, saved, stats, drain);
    } else {
      cpu_forward(ctx, plan, shape, a.forward, saved, stats);
    }
  } else if (plan.device) {
    device_backward(ctx, plan, shape, a.backward, saved, stats, drain);
  } else {
    cpu_backward(ctx, plan, shape, a.backward, saved, stats);
  }
}

// 3. agree, for a call without a plan: the plan it runs on (made into `one_shot`, or the last forward's). A forward
// plans for itself (collective: also agrees on every rank's arguments); a v1.0-style forward (no `saved` slot)
// starts a new step, so what the previous one kept is stale from here on. A backward agrees on the call first, then
// follows its last forward where every rank's does, else plans for itself.
CadPlan* plan_without_handle(CadContext& ctx, Call& call, PlanPtr& one_shot) {
  const CallArgs& a = call.args;
  if (a.kind == kForward) {
    if (!a.v11() || a.forward->saved == nullptr) ctx.last_forward.reset();
    one_shot = make_cad_plan(ctx, *ctx.comm, call.local, a.pieces(), a.stream(), call.what, false);
    return one_shot.get();
  }
  const AgreedCall agreed = agree_on_call(*ctx.comm, call.local, call.what);
  const bool reuse = call.saved == nullptr && agreed.first_rank_not_matching < 0;
  if (call.saved == nullptr && ctx.config.keep_forward_tensors && !reuse) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("backward: rank %d's pieces, shapes or softmax_scale differ from its last forward (or it ran "
                "none); with keep_forward_tensors true the servers hold only the last forward's Q/K/V/O/LSE, so "
                "backward must follow that forward with the same pieces and tensors on every rank",
                agreed.first_rank_not_matching));
  }
  if (reuse) {
    call.saved = ctx.last_forward->saved.get();
    return ctx.last_forward->plan.get();
  }
  one_shot = make_cad_plan(ctx, *ctx.comm, agreed, call.local.num_pieces, a.pieces(), a.stream(), false);
  // The same verdict on every rank: their states' documents were agreed on, the plan is the same everywhere.
  if (call.saved != nullptr) check_saved_documents(call.saved->stamp, one_shot->stamp.documents, call.what);
  return one_shot.get();
}

// 3. agree, for a call with a plan (plan.h: agree_on_plan_call). An invalid call on NCCL drains with the live plan;
// without a live plan nothing tells this rank the collectives' sizes, so it cannot.
void agree_on_planned_call(CadContext& ctx, const Call& call) {
  std::function<void()> drain;
  if (call.given != nullptr) {
    drain = [&] {
      CallStats ignored;
      dispatch(ctx, *call.given, call.given->step.shape, call.args, nullptr, ignored, /*drain=*/true);
    };
  }
  agree_on_plan_call(ctx, call.local, call.what, drain);
}

}  // namespace

void run_call(CadContext& ctx, const CallArgs& args) {
  Stopwatch total;
  const bool forward = args.kind == kForward;
  // A forward starts a new step: the statistics of the previous backward no longer describe it.
  if (forward) ctx.stats.forward = CallStats{};
  ctx.stats.backward = CallStats{};

  // 1. open, 2. validate.
  Call call(args);
  call.local.head_groups = ctx.config.head_groups;
  call.local.ticket.call = ++ctx.calls;
  call.local.ticket.kind = args.kind;
  validate(ctx, call);

  // 3. agree: every rank learns whether every rank's call is valid, and the plan it runs on.
  PlanPtr one_shot(nullptr, PlanDeleter{&ctx});
  CadPlan* plan = call.given;
  if (args.plan() != nullptr) {
    agree_on_planned_call(ctx, call);
  } else {
    plan = plan_without_handle(ctx, call, one_shot);
  }

  // 4. dispatch, with the plan's model statistics (the plan time counts only where the call made its plan) and the
  // call's softmax_scale (a plan fixes no scale).
  CallStats stats = plan->model;
  stats.replanned = one_shot != nullptr;
  if (!stats.replanned) stats.plan_ms = 0.0;
  CallShape shape = plan->step.shape;
  shape.softmax_scale = call.local.shape.softmax_scale;
  // A forward keeps the server batch for its backward: into the caller's `saved` slot, or (v1.0-style calls) the
  // instance's last forward.
  void** const slot = forward && args.v11() ? args.forward->saved : nullptr;
  std::unique_ptr<Saved> kept;
  if (forward && ctx.config.keep_forward_tensors && (slot != nullptr || call.given == nullptr)) {
    kept = std::make_unique<Saved>();
    kept->stamp = SavedStamp{plan->stamp, call.local.ticket.call, call.local.shape.softmax_scale};
  }
  dispatch(ctx, *plan, shape, args, forward ? kept.get() : call.saved, stats);

  // 5. close: a planned call gathers no per-rank byte table (a collective, paid only where an unplanned host-path
  // call communicates anyway).
  if (call.given == nullptr && plan->device == nullptr) gather_bytes(*ctx.comm, stats);
  stats.total_ms = total.lap_ms();
  stats.valid = true;
  (forward ? ctx.stats.forward : ctx.stats.backward) = stats;
  if (ctx.logger.enabled(CAD_LOG_DEBUG)) ctx.logger.debug(stats_line(call.what, stats, ctx.comm->rank()));
  if (!forward) return;
  if (slot != nullptr) {
    if (kept) ctx.saved_handles.add(kept.get());
    *slot = kept.release();
  } else if (call.given == nullptr) {
    auto last = std::make_unique<LastForward>();
    last->plan = std::move(one_shot);
    last->saved = std::move(kept);
    ctx.last_forward = std::move(last);
  }
}

}  // namespace cad::cad_plugin
