// backward.cpp -- one CAD backward: dO (and, unless the servers kept them, Q/K/V/O/LSE) to the
// servers, the server batch's backward, dQ back to the query owners and partial dK/dV back to the
// key/value owners, which sum every server's contribution in server order.
#include <cstring>

#include "data_path.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;
using plugin::tensor_data;

namespace {

bool same_shape(const CallShape& a, const CallShape& b) {
  return a.tokens == b.tokens && a.num_q_heads == b.num_q_heads && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.bf16 == b.bf16 && a.causal == b.causal &&
         std::memcmp(&a.softmax_scale, &b.softmax_scale, sizeof(float)) == 0;
}

bool matches(const LastForward* last, const CallShape& shape, const cad_piece_v1_t* pieces, int64_t num_pieces) {
  if (last == nullptr || !same_shape(last->step.shape, shape)) return false;
  if (static_cast<int64_t>(last->local_pieces.size()) != num_pieces) return false;
  return num_pieces == 0 ||
         std::memcmp(last->local_pieces.data(), pieces, static_cast<size_t>(num_pieces) * sizeof(cad_piece_v1_t)) == 0;
}

// fp32 sums of dK/dV -> the host's tensor in its dtype.
void store_sums(const std::vector<float>& sums, const CallShape& shape, void* out) {
  if (!shape.bf16) {
    if (!sums.empty()) std::memcpy(out, sums.data(), sums.size() * sizeof(float));
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < sums.size(); ++i) dst[i] = float_to_bf16(sums[i]);
}

Part accumulate(std::vector<float>& sums, const CallShape& shape) {
  Part part;
  part.runs = RunSet::KV;
  part.format = Format::AccumulateRows;
  part.data = reinterpret_cast<std::byte*>(sums.data());
  part.row_bytes = shape.kv_row_bytes();
  part.wire_bf16 = shape.bf16;
  return part;
}

}  // namespace

void run_backward(CadContext& ctx, const cad_attention_backward_args_v1_t* args) {
  Stopwatch total;
  Comm& comm = *ctx.comm;
  LocalCall local;
  try {
    local.shape = check_backward_args(args, ctx.accepts);
    local.num_pieces = args->num_pieces;
    local.matches_last_forward = matches(ctx.last_forward.get(), local.shape, args->pieces, args->num_pieces);
  } catch (const plugin::Failure& f) {
    local.status = f.status();
    local.message = f.what();
  }
  ctx.stats.backward = CallStats{};
  const AgreedCall call = agree_on_call(comm, local, "backward");
  const bool reuse = call.first_rank_not_matching < 0;
  if (ctx.config.keep_forward_tensors && !reuse) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("backward: rank %d's pieces or shapes differ from its last forward (or it ran none); with "
                "keep_forward_tensors true the servers hold only the last forward's Q/K/V/O/LSE, so backward must "
                "follow that forward with the same pieces and tensors on every rank",
                call.first_rank_not_matching));
  }
  CallStats stats;
  Step fresh;
  if (!reuse) {
    fresh = prepare_step(comm, ctx.balancer, call, args->pieces, ctx.config.knobs);
    stats.plan_ms = fresh.plan_ms;
    stats.replanned = true;
  }
  const Step& step = reuse ? ctx.last_forward->step : fresh;
  const CallShape& shape = step.shape;
  const ServerBatch& batch = step.layout.servers[static_cast<size_t>(comm.rank())];
  const int64_t q_bytes = shape.q_row_bytes(), kv_bytes = shape.kv_row_bytes();
  const int64_t hq = shape.num_q_heads;

  // 1. dO to the servers, plus everything else when the servers did not keep the forward's tensors.
  std::vector<std::byte> server_d_o = rows_buffer(batch.q_rows, q_bytes);
  KeptBatch resent;
  const bool kept = ctx.config.keep_forward_tensors && ctx.last_forward->has_kept_batch;
  const KeptBatch& in = kept ? ctx.last_forward->kept : resent;
  if (kept) {
    exchange(comm, step.layout, Direction::ToServers, {rows(RunSet::Q, tensor_data(args->d_o), q_bytes)},
             {rows(RunSet::Q, server_d_o.data(), q_bytes)}, stats);
  } else {
    resent.q = rows_buffer(batch.q_rows, q_bytes);
    resent.o = rows_buffer(batch.q_rows, q_bytes);
    resent.lse.assign(static_cast<size_t>(batch.q_rows * hq), 0.0f);
    resent.k = rows_buffer(batch.kv_rows, kv_bytes);
    resent.v = rows_buffer(batch.kv_rows, kv_bytes);
    exchange(comm, step.layout, Direction::ToServers,
             {rows(RunSet::Q, tensor_data(args->d_o), q_bytes), rows(RunSet::Q, tensor_data(args->q), q_bytes),
              rows(RunSet::Q, tensor_data(args->o), q_bytes), lse_columns(tensor_data(args->lse), hq, shape.tokens),
              rows(RunSet::KV, tensor_data(args->k), kv_bytes), rows(RunSet::KV, tensor_data(args->v), kv_bytes)},
             {rows(RunSet::Q, server_d_o.data(), q_bytes), rows(RunSet::Q, resent.q.data(), q_bytes),
              rows(RunSet::Q, resent.o.data(), q_bytes), lse_columns(resent.lse.data(), hq, batch.q_rows),
              rows(RunSet::KV, resent.k.data(), kv_bytes), rows(RunSet::KV, resent.v.data(), kv_bytes)},
             stats);
  }

  // 2. The server batch's backward. dK/dV of a shared KV prefix come out summed over its segments.
  std::vector<std::byte> server_d_q = rows_buffer(batch.q_rows, q_bytes);
  std::vector<std::byte> server_d_k = rows_buffer(batch.kv_rows, kv_bytes);
  std::vector<std::byte> server_d_v = rows_buffer(batch.kv_rows, kv_bytes);
  run_on_server(ctx, "server backend backward", stats, [&]() -> cad_status_t {
    if (batch.q_rows == 0) return CAD_STATUS_OK;
    // The server backend only reads its inputs; the descriptors are non-const by type only.
    auto mut = [](const std::vector<std::byte>& b) { return const_cast<std::byte*>(b.data()); };
    TensorView q(mut(in.q), {batch.q_rows, hq, shape.head_dim}, shape.bf16);
    TensorView k(mut(in.k), {batch.kv_rows, shape.num_kv_heads, shape.head_dim}, shape.bf16);
    TensorView v(mut(in.v), {batch.kv_rows, shape.num_kv_heads, shape.head_dim}, shape.bf16);
    TensorView o(mut(in.o), {batch.q_rows, hq, shape.head_dim}, shape.bf16);
    TensorView lse(const_cast<float*>(in.lse.data()), {hq, batch.q_rows}, false);
    TensorView d_o(server_d_o.data(), {batch.q_rows, hq, shape.head_dim}, shape.bf16);
    TensorView d_q(server_d_q.data(), {batch.q_rows, hq, shape.head_dim}, shape.bf16);
    TensorView d_k(server_d_k.data(), {batch.kv_rows, shape.num_kv_heads, shape.head_dim}, shape.bf16);
    TensorView d_v(server_d_v.data(), {batch.kv_rows, shape.num_kv_heads, shape.head_dim}, shape.bf16);
    cad_attention_backward_args_v1_t server_args{};
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
    server_args.d_o = d_o.get();
    server_args.d_q = d_q.get();
    server_args.d_k = d_k.get();
    server_args.d_v = d_v.get();
    return ctx.server.table->backward(ctx.server.instance, &server_args);
  });

  // 3. dQ to the query owners (each row from exactly one server); dK/dV partial sums to the key/value
  // owners, added up in server order so that the result does not depend on arrival order.
  const size_t kv_elements = static_cast<size_t>(shape.tokens * shape.num_kv_heads * shape.head_dim);
  std::vector<float> sum_k(kv_elements, 0.0f), sum_v(kv_elements, 0.0f);
  exchange(comm, step.layout, Direction::ToOwners,
           {rows(RunSet::Q, server_d_q.data(), q_bytes), rows(RunSet::KV, server_d_k.data(), kv_bytes),
            rows(RunSet::KV, server_d_v.data(), kv_bytes)},
           {rows(RunSet::Q, tensor_data(args->d_q), q_bytes), accumulate(sum_k, shape), accumulate(sum_v, shape)},
           stats);
  store_sums(sum_k, shape, tensor_data(args->d_k));
  store_sums(sum_v, shape, tensor_data(args->d_v));

  describe_step(step.tables, step.tasks, step.layout, shape, stats);
  gather_bytes(comm, stats);
  stats.total_ms = total.lap_ms();
  stats.valid = true;
  ctx.stats.backward = stats;
  if (ctx.logger.enabled(CAD_LOG_DEBUG)) ctx.logger.debug(stats_line("backward", stats, comm.rank()));
}

}  // namespace cad::cad_plugin
