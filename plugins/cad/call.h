// call.h -- one forward or backward through CAD: the same path for both directions (DESIGN.md steps 3-5), in
// forward.cpp and backward.cpp, which add only what their direction checks and keeps:
//   1. open      open_call: the call's number on the instance and its kind (its ticket); live_plan: a plan handle
//                is live on this instance (handles.h) before it is read;
//   2. validate  the direction's own checks (check_forward_args / check_backward_args, validate.h), then
//                check_call_fits: a planned call's shape and pieces are its plan's, a CUDA call's stream is on its
//                tensors' device. A failure is kept in the LocalCall (refuse), not thrown: the ranks agree first;
//   3. agree     with a plan, agree_on_planned_call (plan.h's agree_on_plan_call: one small all_gather on host
//                paths; rank-local on NCCL, where an invalid call drains its collectives); without one, the call's
//                one-shot plan (make_cad_plan, collective, which agrees on every rank's arguments);
//   4. dispatch  run_on_path: the CUDA path (device_path.h) where the plan has device tables, else the CPU path
//                (cpu_path.h), with the plan's model statistics (plan_stats) and the call's softmax_scale
//                (call_shape);
//   5. close     close_call: the per-rank byte table where the call communicates on the host anyway, the call's
//                total time, its statistics in the instance's stats.
#pragma once

#include "context.h"
#include "data_path.h"

namespace cad::cad_plugin {

// A LocalCall for this instance's next call of `kind` (kForward, kBackward): numbered, with this rank's head groups.
LocalCall open_call(CadContext& ctx, CallKind kind);

// The plan behind `handle`, once it is known to be live on this instance (throws INVALID_ARGUMENT otherwise); NULL
// for a NULL handle (a call without a plan).
CadPlan* live_plan(CadContext& ctx, void* handle, const char* what);

// The token count a planned call's tensors must have (its plan's), or -1 without a plan (validate.h).
inline int64_t planned_tokens(const CadPlan* given) { return given != nullptr ? given->step.shape.tokens : -1; }

// The checks every call makes after its direction's own: with a plan, the call's shape and pieces are the plan's;
// on CUDA, `stream` belongs to the tensors' device. Throws as they do.
void check_call_fits(const CadPlan* given, const LocalCall& local, const cad_piece_v1_t* pieces, int64_t num_pieces,
                     void* stream, const char* what);

// Keeps a local check's failure in `local` for the agreement.
void refuse(LocalCall& local, const plugin::Failure& failure);

// A planned call's agreement (plan.h: agree_on_plan_call). `given`: the live plan, which an invalid call on NCCL
// drains with (its collectives run on scratch buffers), or NULL (nothing tells this rank the collectives' sizes).
void agree_on_planned_call(CadContext& ctx, const LocalCall& local, CadPlan* given,
                           const cad_attention_forward_args_v1_t* args, const char* what);
void agree_on_planned_call(CadContext& ctx, const LocalCall& local, CadPlan* given,
                           const cad_attention_backward_args_v1_t* args, const char* what);

// The statistics a call starts from: its plan's model; `replanned`: the call made its own plan (its plan time
// counts), else the plan time is the plan's, not the call's.
CallStats plan_stats(const CadPlan& plan, bool replanned);

// The shape a call runs with: its plan's, with the call's softmax_scale (a plan fixes no scale).
CallShape call_shape(const CadPlan& plan, const LocalCall& local);

// Runs the call on its plan's data path: CUDA where the plan has device tables, else CPU. Forward: `keep` receives
// the server batch for the backward, or NULL. Backward: `saved` is that state, or NULL (the owners re-send it).
void run_on_path(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_forward_args_v1_t* args,
                 Saved* keep, CallStats& stats);
void run_on_path(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_backward_args_v1_t* args,
                 Saved* saved, CallStats& stats);

// Ends a call that ran on `plan`: `planned`: it was given a plan (no per-rank byte table then: that costs a
// collective, paid only where an unplanned host-path call communicates anyway). Stores `stats` in `slot`
// (ctx.stats.forward or .backward) and logs them at debug level as `what`.
void close_call(CadContext& ctx, const CadPlan& plan, bool planned, Stopwatch& total, CallStats& stats, CallStats& slot,
                const char* what);

}  // namespace cad::cad_plugin
