// backward.cpp -- one CAD backward: dO (and, unless the servers kept them, Q/K/V/O/LSE) to the
// servers, the server batch's backward, dQ back to the query owners and partial dK/dV back to the
// key/value owners, which sum every server's contribution in server order (CPU here; CUDA in
// device_path.cpp).
#include <cstring>

#include "data_path.h"
#include "device_path.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;
using plugin::tensor_data;

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

// fp32 sums of dK/dV -> the host's tensor in its dtype.
void store_sums(const std::vector<float>& sums, const CallShape& shape, void* out) {
  if (!shape.bf16) {
    if (!sums.empty()) std::memcpy(out, sums.data(), sums.size() * sizeof(float));
    return;
  }
  uint16_t* dst = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < sums.size(); ++i) dst[i] = float_to_bf16(sums[i]);
}

// The host's dK/dV (its dtype) -> fp32 sums.
void load_sums(const void* in, const CallShape& shape, std::vector<float>& sums) {
  if (!shape.bf16) {
    if (!sums.empty()) std::memcpy(sums.data(), in, sums.size() * sizeof(float));
    return;
  }
  const uint16_t* src = static_cast<const uint16_t*>(in);
  for (size_t i = 0; i < sums.size(); ++i) sums[i] = bf16_to_float(src[i]);
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

void cpu_backward(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_backward_args_v1_t* args,
                  const Saved* saved, CallStats& stats) {
  Comm& comm = *ctx.comm;
  const Step& step = plan.step;
  const ServerBatch& batch = step.layout.servers[static_cast<size_t>(comm.rank())];
  const int64_t q_bytes = shape.q_row_bytes(), kv_bytes = shape.kv_row_bytes();
  const int64_t hq = shape.num_q_heads;

  // 1. dO to the servers, plus everything else when the servers did not keep the forward's tensors.
  std::vector<std::byte> server_d_o = rows_buffer(batch.q_rows, q_bytes);
  KeptBatch resent;
  const bool kept = saved != nullptr;
  const KeptBatch& in = kept ? saved->host : resent;
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

  // 2. The server batch's backward. dK/dV of a shared KV prefix come out summed over its segments. And the
  // tasks this rank runs in place (layout.own), on its own tensors, or on their copies where the forward kept
  // them (the host may then pass stand-ins for q/k/v/o): they write every row of the host's dQ/dK/dV (0 where
  // they read nothing), before the servers' results come back.
  const ServerBatch& own = step.layout.own[static_cast<size_t>(comm.rank())];
  std::vector<std::byte> server_d_q = rows_buffer(batch.q_rows, q_bytes);
  std::vector<std::byte> server_d_k = rows_buffer(batch.kv_rows, kv_bytes);
  std::vector<std::byte> server_d_v = rows_buffer(batch.kv_rows, kv_bytes);
  run_on_server(ctx, "server backend backward", stats, [&]() -> cad_status_t {
    // The server backend only reads its inputs; the descriptors are non-const by type only.
    auto mut = [](const std::vector<std::byte>& b) { return const_cast<std::byte*>(b.data()); };
    if (!own.segments.empty()) {
      ServerBatchTensors t;
      if (kept) {
        t.q = mut(in.own_q), t.k = mut(in.own_k), t.v = mut(in.own_v), t.o = mut(in.own_o);
        t.lse = const_cast<float*>(in.own_lse.data());
      } else {
        t.q = tensor_data(args->q), t.k = tensor_data(args->k), t.v = tensor_data(args->v), t.o = tensor_data(args->o);
        t.lse = static_cast<float*>(tensor_data(args->lse));
      }
      t.d_o = tensor_data(args->d_o), t.d_q = tensor_data(args->d_q), t.d_k = tensor_data(args->d_k);
      t.d_v = tensor_data(args->d_v);
      const cad_status_t status = call_server_backward(ctx, plan, Batch::Own, shape, t,
                                                       cad_device_v1_t{CAD_DEVICE_CPU, 0}, nullptr);
      if (status != CAD_STATUS_OK) server_failed(ctx.own_server, status, "backward of the tasks run in place");
    }
    if (batch.q_rows == 0) return CAD_STATUS_OK;
    ServerBatchTensors t;
    t.q = mut(in.q), t.k = mut(in.k), t.v = mut(in.v), t.o = mut(in.o), t.lse = const_cast<float*>(in.lse.data());
    t.d_o = server_d_o.data(), t.d_q = server_d_q.data(), t.d_k = server_d_k.data(), t.d_v = server_d_v.data();
    return call_server_backward(ctx, plan, Batch::Served, shape, t, cad_device_v1_t{CAD_DEVICE_CPU, 0}, nullptr);
  });

  // 3. dQ to the query owners (each row from exactly one server); dK/dV partial sums to the key/value
  // owners, added up in server order so that the result does not depend on arrival order (after this rank's
  // own tasks' sums, where it ran any).
  const size_t kv_elements = static_cast<size_t>(shape.tokens * shape.num_kv_heads * shape.head_dim);
  std::vector<float> sum_k(kv_elements, 0.0f), sum_v(kv_elements, 0.0f);
  if (!own.segments.empty()) {
    load_sums(tensor_data(args->d_k), shape, sum_k);
    load_sums(tensor_data(args->d_v), shape, sum_v);
  }
  exchange(comm, step.layout, Direction::ToOwners,
           {rows(RunSet::Q, server_d_q.data(), q_bytes), rows(RunSet::KV, server_d_k.data(), kv_bytes),
            rows(RunSet::KV, server_d_v.data(), kv_bytes)},
           {rows(RunSet::Q, tensor_data(args->d_q), q_bytes), accumulate(sum_k, shape), accumulate(sum_v, shape)},
           stats);
  store_sums(sum_k, shape, tensor_data(args->d_k));
  store_sums(sum_v, shape, tensor_data(args->d_v));
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

  LocalCall local;
  local.head_groups = ctx.config.head_groups;
  local.ticket.call = ++ctx.calls;
  local.ticket.kind = kBackward;
  try {
    if (plan_handle != nullptr) {
      ctx.plan_handles.check_live(plan_handle, "backward");
      given = static_cast<CadPlan*>(plan_handle);
    }
    if (saved_handle != nullptr) {
      ctx.saved_handles.check_live(saved_handle, "backward");
      saved = static_cast<Saved*>(saved_handle);
    }
    local.shape = check_backward_args(args, ctx.accepts, given != nullptr ? given->step.shape.tokens : -1);
    local.num_pieces = args->num_pieces;
    if (given != nullptr) check_call_matches_plan(*given, local.shape, args->pieces, args->num_pieces, "backward");
    if (local.shape.device_type == CAD_DEVICE_CUDA) check_call_stream(args->stream, local.shape.device_id, "backward");
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
    local.status = f.status();
    local.message = f.what();
  }

  CallStats stats;
  PlanPtr one_shot(nullptr, PlanDeleter{&ctx});
  CadPlan* plan = given;
  if (plan_handle != nullptr) {
    std::function<void()> drain;  // none without a live plan: nothing tells this rank the collectives' sizes
    if (given != nullptr) {
      drain = [&] { device_backward(ctx, *given, given->step.shape, args, nullptr, stats, /*drain=*/true); };
    }
    agree_on_plan_call(ctx, local, "backward", drain);
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
  stats = plan->model;
  stats.replanned = one_shot != nullptr;
  if (!stats.replanned) stats.plan_ms = 0.0;
  CallShape shape = plan->step.shape;
  shape.softmax_scale = local.shape.softmax_scale;
  if (plan->device) {
    device_backward(ctx, *plan, shape, args, saved, stats);
  } else {
    cpu_backward(ctx, *plan, shape, args, saved, stats);
  }
  if (given == nullptr && plan->device == nullptr) gather_bytes(comm, stats);
  stats.total_ms = total.lap_ms();
  stats.valid = true;
  ctx.stats.backward = stats;
  if (ctx.logger.enabled(CAD_LOG_DEBUG)) ctx.logger.debug(stats_line("backward", stats, comm.rank()));
}

}  // namespace cad::cad_plugin
