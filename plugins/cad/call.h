// call.h -- one forward or backward through CAD: ONE path for both directions (DESIGN.md steps 3-5), parameterised
// by the direction (CallArgs::kind, call_check.h). In call.cpp:
//   1. open      the call's number on the instance and its kind (its ticket); a plan handle, and a backward's saved
//                handle, are live on this instance (handles.h) before either is read;
//   2. validate  check_call (call_check.h): the call's tensors against its plan (or, without one, against its own
//                pieces and the server backend), then on CUDA that the stream is on the tensors' device; a
//                backward's saved state against the call (handles.h). A failure is kept in the LocalCall, not
//                thrown: the ranks agree first;
//   3. agree     with a plan: agree_on_plan_call (plan.h: one small all_gather on host paths; rank-local on NCCL,
//                where an invalid call drains its collectives); without one: a forward makes its one-shot plan
//                (make_cad_plan, collective, which agrees on every rank's arguments), a backward agrees on the call
//                and reuses its last forward's plan or makes a one-shot plan;
//   4. dispatch  the direction's data path on the plan's device: CUDA where the plan has device tables
//                (device_path.h), else CPU (cpu_path.h), with the plan's model statistics and the call's
//                softmax_scale;
//   5. close     the per-rank byte table where the call communicates on the host anyway, the call's total time, its
//                statistics in the instance's stats; a forward hands out (or keeps) what its backward needs.
// What differs by direction is only what it keeps or reads (the server batch a forward keeps for its backward) and
// how a backward without a plan finds one; the data paths themselves are per direction (cpu_path.h, device_path.h).
#pragma once

#include "call_check.h"
#include "context.h"

namespace cad::cad_plugin {

// One forward or backward call on the instance (plugin.cpp's entry points). Throws plugin::Failure.
void run_call(CadContext& ctx, const CallArgs& call);

}  // namespace cad::cad_plugin
