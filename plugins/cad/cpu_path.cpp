// cpu_path.cpp -- see cpu_path.h.
#include "cpu_path.h"

#include <cstring>

#include "data_path.h"

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

namespace {

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

}  // namespace

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

}  // namespace cad::cad_plugin
