// plan.cpp -- see plan.h.
#include "plan.h"

#include "context.h"
#include "device_path.h"
#include "plugin_support.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

void DevicePlanDeleter::operator()(DevicePlan* plan) const { release_device_plan(*ctx, plan); }

void PlanDeleter::operator()(CadPlan* plan) const {
  if (plan == nullptr) return;
  // A plan that fails while being made ahead goes back from the planning thread: the server backend and the
  // device memory are shared with the other thread's calls.
  std::lock_guard<std::recursive_mutex> shared(ctx->state_mutex);
  if (plan->server_plan != nullptr && ctx->server.has_plans()) {
    ctx->server.table->release_plan(ctx->server.instance, plan->server_plan);
  }
  if (plan->own_server_plan != nullptr && ctx->own_server.has_plans()) {
    ctx->own_server.table->release_plan(ctx->own_server.instance, plan->own_server_plan);
  }
  delete plan;  // the device plan goes back through its own deleter
}

namespace {

// The server backend's plan of one of this rank's batches (layout.servers or layout.own), where the backend
// makes plans and the batch is not empty (an empty batch never calls the backend).
void* make_server_plan(const ServerBackend& server, const CallShape& shape, const ServerBatch& batch, void* stream) {
  if (!server.has_plans() || batch.segments.empty()) return nullptr;
  const cad_attention_plan_args_v1_t args = server_plan_args(batch, shape, stream);
  void* plan = nullptr;
  if (server.table->make_plan(server.instance, &args, &plan) != CAD_STATUS_OK) {
    const char* message = server.table->last_error(server.instance);
    fail(CAD_STATUS_INTERNAL, "server backend instance '" + server.name +
                                  "': make_plan of this rank's batch failed: " + (message ? message : "(no message)"));
  }
  return plan;
}

}  // namespace

PlanPtr make_cad_plan(CadContext& ctx, Comm& comm, const LocalCall& local, const cad_piece_v1_t* pieces, void* stream,
                      const char* what, bool concurrent) {
  const AgreedCall call = agree_on_call(comm, local, what);
  return make_cad_plan(ctx, comm, call, local.num_pieces, pieces, stream, concurrent);
}

namespace {

// A planned call's verdict and ticket, one all_gather for both (the agreement these calls always made, now
// also telling that every rank is in the same call with the same plan, scale and forward's state).
struct PlanCallHeader {
  int32_t status;
  CallTicket ticket;
  char message[232];
};

}  // namespace

void agree_on_plan_call(CadContext& ctx, const LocalCall& local, const char* what, const std::function<void()>& drain) {
  const bool host_side = ctx.accepts.device_type == CAD_DEVICE_CPU || ctx.host_staged;
  if (host_side) {
    PlanCallHeader mine{};
    mine.status = local.status;
    mine.ticket = local.ticket;
    plugin::copy_message(local.message, mine.message, sizeof(mine.message));
    const std::vector<PlanCallHeader> all = ctx.comm->all_gather_value(mine);
    std::vector<CallTicket> tickets;
    for (size_t rank = 0; rank < all.size(); ++rank) {
      if (all[rank].status != CAD_STATUS_OK) {
        PlanCallHeader h = all[rank];
        h.message[sizeof(h.message) - 1] = '\0';
        fail(h.status, format("%s on rank %zu: %s", what, rank, h.message));
      }
      tickets.push_back(all[rank].ticket);
    }
    check_tickets(tickets, what);
    return;
  }
  if (local.status == CAD_STATUS_OK) return;
  try {
    if (drain) drain();
  } catch (const plugin::Failure&) {
    // the call's own failure is the one to report
  }
  fail(local.status, format("%s on rank %d: %s", what, ctx.comm->rank(), local.message.c_str()));
}

PlanPtr make_cad_plan(CadContext& ctx, Comm& comm, const AgreedCall& call, int64_t num_local_pieces,
                      const cad_piece_v1_t* pieces, void* stream, bool concurrent) {
  PlanPtr plan(new CadPlan, PlanDeleter{&ctx});
  plan->device = std::unique_ptr<DevicePlan, DevicePlanDeleter>(nullptr, DevicePlanDeleter{&ctx});
  plan->step = prepare_step(comm, ctx.balancer, call, pieces, ctx.config.knobs, ctx.config.own_tasks_in_place,
                            [&](Step& step) {
    // The server backend and the device runtime are shared with the calls another thread may be making.
    std::unique_lock<std::recursive_mutex> shared(ctx.state_mutex, std::defer_lock);
    if (concurrent) shared.lock();
    const size_t me = static_cast<size_t>(ctx.comm->rank());
    // The server batch runs a head group at a time where the data path pipelines groups (the tasks run in place
    // move nothing: they run on all heads at once).
    const int32_t groups = step.shape.device_type == CAD_DEVICE_CUDA && !ctx.host_staged ? ctx.config.head_groups : 1;
    plan->server_plan = make_server_plan(ctx.server, head_group_shape(step.shape, groups), step.layout.servers[me],
                                         stream);
    plan->own_server_plan = make_server_plan(ctx.own_server, step.shape, step.layout.own[me], stream);
    if (step.shape.device_type == CAD_DEVICE_CUDA) {
      plan->device.reset(make_device_plan(ctx, step, groups, stream));
    }
  });
  if (num_local_pieces > 0) plan->local_pieces.assign(pieces, pieces + num_local_pieces);
  plan->stamp.serial = next_handle_serial();
  plan->stamp.documents = documents_fingerprint(plan->step.tables, plan->step.tasks, plan->step.shape);
  plan->stamp.local_pieces = pieces_fingerprint(pieces, num_local_pieces);
  plan->stamp.shape = plan->step.shape;
  plan->stamp.shape.softmax_scale = 0.0f;  // per call
  describe_step(plan->step.tables, plan->step.tasks, plan->step.layout, plan->step.shape, plan->model);
  plan->model.plan_ms = plan->step.plan_ms;
  return plan;
}

}  // namespace cad::cad_plugin
