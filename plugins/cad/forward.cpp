// forward.cpp -- one CAD forward: agree, plan, dispatch Q/K/V to the servers, run the server batch,
// bring O and LSE back into the host's token order.
#include "data_path.h"

namespace cad::cad_plugin {

using plugin::tensor_data;

void run_forward(CadContext& ctx, const cad_attention_forward_args_v1_t* args) {
  Stopwatch total;
  Comm& comm = *ctx.comm;
  LocalCall local;
  try {
    local.shape = check_forward_args(args, ctx.accepts);
    local.num_pieces = args->num_pieces;
  } catch (const plugin::Failure& f) {
    local.status = f.status();
    local.message = f.what();
  }
  // A forward starts a new step: what the previous one kept is stale from here on.
  ctx.last_forward.reset();
  ctx.stats.forward = CallStats{};
  ctx.stats.backward = CallStats{};

  const AgreedCall call = agree_on_call(comm, local, "forward");
  auto last = std::make_unique<LastForward>();
  last->step = prepare_step(comm, ctx.balancer, call, args->pieces, ctx.config.knobs);
  const Step& step = last->step;
  const CallShape& shape = step.shape;
  const ServerBatch& batch = step.layout.servers[static_cast<size_t>(comm.rank())];
  const int64_t q_bytes = shape.q_row_bytes(), kv_bytes = shape.kv_row_bytes();
  CallStats stats;
  stats.replanned = true;
  stats.plan_ms = step.plan_ms;

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

  // 2. The server batch: one varlen call; segments of one document share its KV prefix.
  server.o = rows_buffer(batch.q_rows, q_bytes);
  server.lse.assign(static_cast<size_t>(batch.q_rows * shape.num_q_heads), 0.0f);
  run_on_server(ctx, "server backend forward", stats, [&]() -> cad_status_t {
    if (batch.q_rows == 0) return CAD_STATUS_OK;  // nothing to serve
    TensorView q(server.q.data(), {batch.q_rows, shape.num_q_heads, shape.head_dim}, shape.bf16);
    TensorView k(server.k.data(), {batch.kv_rows, shape.num_kv_heads, shape.head_dim}, shape.bf16);
    TensorView v(server.v.data(), {batch.kv_rows, shape.num_kv_heads, shape.head_dim}, shape.bf16);
    TensorView o(server.o.data(), {batch.q_rows, shape.num_q_heads, shape.head_dim}, shape.bf16);
    TensorView lse(server.lse.data(), {shape.num_q_heads, batch.q_rows}, false);
    cad_attention_forward_args_v1_t server_args{};
    server_args.struct_size = sizeof(server_args);
    server_args.segments = batch.segments.data();
    server_args.num_segments = static_cast<int64_t>(batch.segments.size());
    server_args.softmax_scale = shape.softmax_scale;
    server_args.causal = shape.causal ? 1 : 0;
    server_args.q = q.get();
    server_args.k = k.get();
    server_args.v = v.get();
    server_args.o = o.get();
    server_args.lse = lse.get();
    return ctx.server.table->forward(ctx.server.instance, &server_args);
  });

  // 3. O and LSE back to the owners. The plan covers every token exactly once, so every row of the
  // host's O and every column of its LSE is written.
  exchange(comm, step.layout, Direction::ToOwners,
           {rows(RunSet::Q, server.o.data(), q_bytes), lse_columns(server.lse.data(), shape.num_q_heads, batch.q_rows)},
           {rows(RunSet::Q, tensor_data(args->o), q_bytes),
            lse_columns(tensor_data(args->lse), shape.num_q_heads, shape.tokens)},
           stats);

  describe_step(step.tables, step.tasks, step.layout, shape, stats);
  gather_bytes(comm, stats);
  stats.total_ms = total.lap_ms();
  stats.valid = true;
  ctx.stats.forward = stats;
  if (ctx.logger.enabled(CAD_LOG_DEBUG)) ctx.logger.debug(stats_line("forward", stats, comm.rank()));

  if (args->num_pieces > 0) last->local_pieces.assign(args->pieces, args->pieces + args->num_pieces);
  if (ctx.config.keep_forward_tensors) {
    last->kept = std::move(server);
    last->has_kept_batch = true;
  }
  ctx.last_forward = std::move(last);
}

}  // namespace cad::cad_plugin
