// data_path.cpp -- see data_path.h.
#include "data_path.h"

#include <ctime>
#include <memory>

#include "wire.h"

namespace cad::cad_plugin {

TensorView::TensorView(void* data, std::vector<int64_t> shape, bool bf16, cad_device_v1_t device)
    : shape_(std::move(shape)) {
  tensor_.data = data;
  tensor_.device = device;
  tensor_.ndim = static_cast<int32_t>(shape_.size());
  tensor_.dtype = bf16 ? cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1} : cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1};
  tensor_.shape = shape_.data();
  tensor_.strides = nullptr;
  tensor_.byte_offset = 0;
}

double CpuStopwatch::now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

double CpuStopwatch::lap_ms() {
  const double now = now_ms();
  const double ms = now - start_ms_;
  start_ms_ = now;
  return ms;
}

Part rows(RunSet runs, void* data, int64_t row_bytes) {
  Part part;
  part.runs = runs;
  part.format = Format::Rows;
  part.data = static_cast<std::byte*>(data);
  part.row_bytes = row_bytes;
  return part;
}

Part lse_columns(void* data, int64_t heads, int64_t rows) {
  Part part;
  part.runs = RunSet::Q;
  part.format = Format::LseColumns;
  part.data = static_cast<std::byte*>(data);
  part.row_bytes = heads * static_cast<int64_t>(sizeof(float));
  part.lse_heads = heads;
  part.lse_rows = rows;
  return part;
}

namespace {

// Descriptors of the server batch's tensors, and the batch description both calls share.
struct ServerViews {
  ServerViews(const ServerBatch& b, const CallShape& s, const ServerBatchTensors& t, cad_device_v1_t device)
      : q(t.q, {b.q_rows, s.num_q_heads, s.head_dim}, s.bf16, device),
        k(t.k, {b.kv_rows, s.num_kv_heads, s.head_dim}, s.bf16, device),
        v(t.v, {b.kv_rows, s.num_kv_heads, s.head_dim}, s.bf16, device),
        o(t.o, {b.q_rows, s.num_q_heads, s.head_dim}, s.bf16, device),
        lse(t.lse, {s.num_q_heads, b.q_rows}, false, device),
        d_o(t.d_o, {b.q_rows, s.num_q_heads, s.head_dim}, s.bf16, device),
        d_q(t.d_q, {b.q_rows, s.num_q_heads, s.head_dim}, s.bf16, device),
        d_k(t.d_k, {b.kv_rows, s.num_kv_heads, s.head_dim}, s.bf16, device),
        d_v(t.d_v, {b.kv_rows, s.num_kv_heads, s.head_dim}, s.bf16, device) {}
  TensorView q, k, v, o, lse, d_o, d_q, d_k, d_v;
};

template <class Args>
void describe_server_batch(Args& a, void* server_plan, const ServerBatch& batch, const CallShape& shape,
                           void* stream) {
  a.struct_size = sizeof(a);
  a.segments = server_plan != nullptr ? nullptr : batch.segments.data();
  a.num_segments = server_plan != nullptr ? 0 : static_cast<int64_t>(batch.segments.size());
  a.softmax_scale = shape.softmax_scale;
  a.causal = shape.causal ? 1 : 0;
  a.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit
  a.window_left = shape.window_left;
  a.window_right = -1;
  a.stream = stream;
  a.plan = server_plan;
}

// One of this rank's batches, the backend's plan of it and the backend instance that runs it.
struct ServerCall {
  const ServerBatch& batch;
  void* plan;
  const ServerBackend& server;
};

ServerCall server_call(CadContext& ctx, const CadPlan& plan, Batch which) {
  const size_t me = static_cast<size_t>(ctx.comm->rank());
  if (which == Batch::Own) return {plan.step.layout.own[me], plan.own_server_plan, ctx.own_server};
  return {plan.step.layout.servers[me], plan.server_plan, ctx.server};
}

}  // namespace

cad_status_t call_server_forward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                 const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  const ServerCall c = server_call(ctx, plan, which);
  ServerViews views(c.batch, shape, t, device);
  cad_attention_forward_args_v1_t a{};  // describe_server_batch sets every scalar, the window too
  describe_server_batch(a, c.plan, c.batch, shape, stream);
  a.q = views.q.get(), a.k = views.k.get(), a.v = views.v.get(), a.o = views.o.get(), a.lse = views.lse.get();
  return c.server.table->forward(c.server.instance, &a);
}

cad_status_t call_server_backward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                  const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  const ServerCall c = server_call(ctx, plan, which);
  ServerViews views(c.batch, shape, t, device);
  cad_attention_backward_args_v1_t a{};
  describe_server_batch(a, c.plan, c.batch, shape, stream);
  a.q = views.q.get(), a.k = views.k.get(), a.v = views.v.get(), a.o = views.o.get(), a.lse = views.lse.get();
  a.d_o = views.d_o.get(), a.d_q = views.d_q.get(), a.d_k = views.d_k.get(), a.d_v = views.d_v.get();
  return c.server.table->backward(c.server.instance, &a);
}

void server_failed(const ServerBackend& server, cad_status_t status, const char* what) {
  const char* message = server.table->last_error(server.instance);
  plugin::fail(status, plugin::format("server backend instance '%s': %s failed: %s", server.name.c_str(), what,
                                      message != nullptr ? message : "(no message)"));
}

void exchange(Comm& comm, const Layout& layout, Direction direction, const std::vector<Part>& send,
              const std::vector<Part>& recv, CallStats& stats) {
  const int32_t me = comm.rank();
  const Transfer transfer = plan_transfer(layout, me, direction, send, recv);
  // Staging buffers, left uninitialised: pack writes every byte that is sent, the transfer every byte
  // that is unpacked.
  const std::unique_ptr<std::byte[]> send_buffer(new std::byte[transfer.send_bytes]);
  const std::unique_ptr<std::byte[]> recv_buffer(new std::byte[transfer.recv_bytes]);
  Stopwatch watch;
  pack(layout, me, direction, send, transfer, send_buffer.get());
  stats.pack_ms += watch.lap_ms();
  WireTicket ticket;  // a host wire has nothing to join
  HostWire(comm).move(send_buffer.get(), transfer, recv_buffer.get(), /*timed=*/false, ticket);
  stats.exchange_ms += watch.lap_ms();
  unpack(layout, me, direction, recv, transfer, recv_buffer.get());
  stats.unpack_ms += watch.lap_ms();
  const size_t self = static_cast<size_t>(me);
  stats.bytes_sent += transfer.send_bytes - transfer.send_counts[self];
  stats.bytes_received += transfer.recv_bytes - transfer.recv_counts[self];
}

}  // namespace cad::cad_plugin
