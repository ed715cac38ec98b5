// plan.h -- a CAD plan: one micro-batch's agreed piece tables, the balancer's tasks and the dispatch
// layout, plus what the data path needs to run them again and again without talking to other ranks
// (the server backend's own plan of this rank's batch; on CUDA the device index tables and buffers).
// Made once per micro-batch (collective), used by every layer's forward and backward, released by
// the host. A call without a plan makes a one-shot plan the same way.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "stats.h"
#include "step.h"

namespace cad::cad_plugin {

struct CadContext;
struct DevicePlan;  // device_plan.h: CUDA tables and buffers

struct DevicePlanDeleter {
  CadContext* ctx = nullptr;
  void operator()(DevicePlan* plan) const;
};

struct CadPlan {
  Step step;                                 // shape (softmax_scale unset: it is per call), tables, layout
  std::vector<cad_piece_v1_t> local_pieces;  // to recognise a call's pieces as the plan's (call_check.h)
  void* server_plan = nullptr;               // the server backend's plan of this rank's batch, if it makes plans
  void* own_server_plan = nullptr;           // the same for the tasks it runs in place (layout.own)
  std::unique_ptr<DevicePlan, DevicePlanDeleter> device;  // CUDA data path only
  CallStats model;                           // servers' work and the cost model's bytes, computed once
  PlanStamp stamp;                           // what it was made for (serial, documents, shape): handles.h
};

struct PlanDeleter {
  CadContext* ctx = nullptr;
  void operator()(CadPlan* plan) const;
};
using PlanPtr = std::unique_ptr<CadPlan, PlanDeleter>;

// Collective: agrees on every rank's call (`local` holds its checks' verdict), gathers the piece tables,
// plans, lays out, prepares the server backend and device resources, and agrees on the outcome, so that
// every rank gets a plan or every rank fails with the same message. `comm`: where its collectives run (the
// data communicator inside a call, CadContext::planning_comm for make_plan). `stream`: where device tables
// are uploaded (CUDA), in stream order: they are ready for calls on that stream, and other streams wait for
// the plan's event. `concurrent`: the caller does not hold ctx.state_mutex (a plan made ahead on another
// thread); it is then taken around the server backend's plan and the device tables, never across a collective.
PlanPtr make_cad_plan(CadContext& ctx, Comm& comm, const LocalCall& local, const cad_piece_v1_t* pieces, void* stream,
                      const char* what, bool concurrent);
// The same after agree_on_call (the caller agreed already).
PlanPtr make_cad_plan(CadContext& ctx, Comm& comm, const AgreedCall& call, int64_t num_local_pieces,
                      const cad_piece_v1_t* pieces, void* stream, bool concurrent);

// A call made with a plan: every rank learns whether every rank's call is valid. On host-side data paths
// (CPU, host-staged) with one small all_gather of each rank's verdict and ticket (every rank throws the
// lowest failing rank's message, or check_tickets' when the ranks' tickets differ: other plans, scales,
// forwards' state, or calls). On
// NCCL, where a call must not synchronise the host, a rank whose call is invalid runs its collectives on
// scratch buffers (`drain`, so no peer waits forever) and throws its own message; its peers' outputs of
// that call are then undefined. No ticket is compared there. `drain` is empty when the rank has no live plan
// to drain with (its peers' collectives of that call then never complete).
void agree_on_plan_call(CadContext& ctx, const LocalCall& local, const char* what, const std::function<void()>& drain);

}  // namespace cad::cad_plugin
