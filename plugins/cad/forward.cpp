// forward.cpp -- one CAD forward: find or make the plan, dispatch Q/K/V to the servers, run the server
// batch, bring O and LSE back into the host's token order (CPU here; CUDA in device_path.cpp).
#include "data_path.h"
#include "device_path.h"

namespace cad::cad_plugin {

using plugin::tensor_data;

void cpu_forward(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_forward_args_v1_t* args,
                 Saved* keep, CallStats& stats) {
  Comm& comm = *ctx.comm;
  const Step& step = plan.step;
  const ServerBatch& batch = step.layout.servers[static_cast<size_t>(comm.rank())];
  const int64_t q_bytes = shape.q_row_bytes(), kv_bytes = shape.kv_row_bytes();

  // 1. Q/K/V of the owners -> server batch.
  KeptBatch server;
  server.q = rows_buffer(batch.q_rows, q_bytes);
  server.k = rows_buffer(batch.kv_rows, kv_bytes);
  server.v = rows_buffer(batch.kv_rows, kv_bytes);
  exchange(comm, step.layout, Direction::ToServers,
           {rows(RunSet::Q, tensor_data(args->q), q_bytes), rows(RunSet::KV, tensor_data(args->k), kv_bytes),
            rows(RunSet::KV, tensor_data(args->v), kv_bytes)},
           {rows(RunSet::Q, server.q.data(), q_bytes), rows(RunSet::KV, server.k.data(), kv_bytes),
            rows(RunSet::KV, server.v.data(), kv_bytes)},
           stats);

  // 2. The server batch: one varlen call; segments of one document share its KV prefix. And the tasks this
  // rank runs in place on its own tensors (layout.own): they write every row of the host's O and LSE (0 and
  // -inf where they have no segment), so they run before the exchange brings the other rows back.
  const ServerBatch& own = step.layout.own[static_cast<size_t>(comm.rank())];
  server.o = rows_buffer(batch.q_rows, q_bytes);
  server.lse.assign(static_cast<size_t>(batch.q_rows * shape.num_q_heads), 0.0f);
  run_on_server(ctx, "server backend forward", stats, [&]() -> cad_status_t {
    if (!own.segments.empty()) {
      ServerBatchTensors t;
      t.q = tensor_data(args->q), t.k = tensor_data(args->k), t.v = tensor_data(args->v), t.o = tensor_data(args->o);
      t.lse = static_cast<float*>(tensor_data(args->lse));
      const cad_status_t status = call_server_forward(ctx, plan, Batch::Own, shape, t, cad_device_v1_t{CAD_DEVICE_CPU, 0},
                                                      nullptr);
      if (status != CAD_STATUS_OK) server_failed(ctx.own_server, status, "forward of the tasks run in place");
    }
    if (batch.q_rows == 0) return CAD_STATUS_OK;  // nothing to serve
    ServerBatchTensors t;
    t.q = server.q.data(), t.k = server.k.data(), t.v = server.v.data(), t.o = server.o.data();
    t.lse = server.lse.data();
    return call_server_forward(ctx, plan, Batch::Served, shape, t, cad_device_v1_t{CAD_DEVICE_CPU, 0}, nullptr);
  });
  if (keep != nullptr && !own.segments.empty()) {  // the backward may get stand-ins for q/k/v/o
    const auto copy = [](const cad_tensor_v1_t* t, int64_t bytes) {
      const std::byte* p = static_cast<const std::byte*>(tensor_data(t));
      return std::vector<std::byte>(p, p + bytes);
    };
    server.own_q = copy(args->q, shape.tokens * q_bytes);
    server.own_k = copy(args->k, shape.tokens * kv_bytes);
    server.own_v = copy(args->v, shape.tokens * kv_bytes);
    server.own_o = copy(args->o, shape.tokens * q_bytes);
    const float* lse = static_cast<const float*>(tensor_data(args->lse));
    server.own_lse.assign(lse, lse + shape.tokens * shape.num_q_heads);
  }

  // 3. O and LSE back to the owners. The plan covers every token exactly once, so every row of the
  // host's O and every column of its LSE is written.
  exchange(comm, step.layout, Direction::ToOwners,
           {rows(RunSet::Q, server.o.data(), q_bytes), lse_columns(server.lse.data(), shape.num_q_heads, batch.q_rows)},
           {rows(RunSet::Q, tensor_data(args->o), q_bytes),
            lse_columns(tensor_data(args->lse), shape.num_q_heads, shape.tokens)},
           stats);
  if (keep != nullptr) keep->host = std::move(server);
}

void run_forward(CadContext& ctx, const cad_attention_forward_args_v1_t* args) {
  Stopwatch total;
  const bool v11 = args != nullptr && CAD_HAS_FIELD(cad_attention_forward_args_v1_t, args, saved);
  void* const plan_handle = v11 ? args->plan : nullptr;
  CadPlan* given = nullptr;  // plan_handle once it is known to be live on this instance
  void** saved_slot = v11 ? args->saved : nullptr;
  // A forward starts a new step: the statistics of the previous backward no longer describe it.
  ctx.stats.forward = CallStats{};
  ctx.stats.backward = CallStats{};

  LocalCall local;
  local.head_groups = ctx.config.head_groups;
  local.ticket.call = ++ctx.calls;
  local.ticket.kind = kForward;
  try {
    if (plan_handle != nullptr) {
      ctx.plan_handles.check_live(plan_handle, "forward");
      given = static_cast<CadPlan*>(plan_handle);
      local.ticket.documents = given->stamp.documents;
    }
    local.shape = check_forward_args(args, ctx.accepts, given != nullptr ? given->step.shape.tokens : -1);
    local.ticket.softmax_scale = local.shape.softmax_scale;
    local.num_pieces = args->num_pieces;
    if (given != nullptr) check_call_matches_plan(*given, local.shape, args->pieces, args->num_pieces, "forward");
    if (local.shape.device_type == CAD_DEVICE_CUDA) check_call_stream(args->stream, local.shape.device_id, "forward");
  } catch (const plugin::Failure& f) {
    local.status = f.status();
    local.message = f.what();
  }

  PlanPtr one_shot(nullptr, PlanDeleter{&ctx});
  CadPlan* plan = given;
  CallStats stats;
  if (plan_handle == nullptr) {
    // No plan: this call plans for itself (collective: also agrees on every rank's arguments). A v1.0-style
    // forward starts a new step: what the previous one kept is stale from here on.
    if (saved_slot == nullptr) ctx.last_forward.reset();
    one_shot = make_cad_plan(ctx, *ctx.comm, local, args->pieces, args->stream, "forward", false);
    plan = one_shot.get();
    stats = plan->model;
    stats.replanned = true;
  } else {
    std::function<void()> drain;  // none without a live plan: nothing tells this rank the collectives' sizes
    if (given != nullptr) {
      drain = [&] { device_forward(ctx, *given, given->step.shape, args, nullptr, stats, /*drain=*/true); };
    }
    agree_on_plan_call(ctx, local, "forward", drain);
    stats = plan->model;
    stats.plan_ms = 0.0;
  }
  CallShape shape = plan->step.shape;
  shape.softmax_scale = local.shape.softmax_scale;

  // Keep the server batch for backward: into the caller's `saved` handle, or (v1.0-style calls) the
  // instance's last forward.
  const bool keep = ctx.config.keep_forward_tensors && (saved_slot != nullptr || given == nullptr);
  std::unique_ptr<Saved> saved = keep ? std::make_unique<Saved>() : nullptr;
  if (saved) saved->stamp = SavedStamp{plan->stamp, local.ticket.call, local.shape.softmax_scale};
  if (plan->device) {
    device_forward(ctx, *plan, shape, args, saved.get(), stats);
  } else {
    cpu_forward(ctx, *plan, shape, args, saved.get(), stats);
  }
  // The per-rank byte table costs a collective: only where this call communicates on the host anyway.
  if (given == nullptr && plan->device == nullptr) gather_bytes(*ctx.comm, stats);
  stats.total_ms = total.lap_ms();
  stats.valid = true;
  ctx.stats.forward = stats;
  if (ctx.logger.enabled(CAD_LOG_DEBUG)) ctx.logger.debug(stats_line("forward", stats, ctx.comm->rank()));

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
