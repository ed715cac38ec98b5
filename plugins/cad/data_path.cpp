// data_path.cpp -- see data_path.h.
#include "data_path.h"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <memory>

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

// Descriptors of one server call's tensors (its part's rows), and the description both calls share.
struct ServerViews {
  ServerViews(const BatchPart& b, const CallShape& s, const ServerBatchTensors& t, cad_device_v1_t device)
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
void describe_server_call(Args& a, const ServerCall& call, const CallShape& shape, void* stream) {
  a.struct_size = sizeof(a);
  a.segments = call.backend_plan != nullptr ? nullptr : call.segments.data();
  a.num_segments = call.backend_plan != nullptr ? 0 : static_cast<int64_t>(call.segments.size());
  a.softmax_scale = shape.softmax_scale;
  a.causal = shape.causal ? 1 : 0;
  a.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit
  a.window_left = shape.window_left;
  a.window_right = -1;
  a.stream = stream;
  a.plan = call.backend_plan;
}

std::byte* row_at(void* base, int64_t row, int64_t row_bytes) {
  return base != nullptr ? static_cast<std::byte*>(base) + row * row_bytes : nullptr;
}

}  // namespace

cad_status_t call_server_forward(CadContext& ctx, const ServerCall& call, const CallShape& shape,
                                 const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  ServerViews views(call.part, shape, t, device);
  cad_attention_forward_args_v1_t a{};  // describe_server_call sets every scalar, the window too
  describe_server_call(a, call, shape, stream);
  a.q = views.q.get(), a.k = views.k.get(), a.v = views.v.get(), a.o = views.o.get(), a.lse = views.lse.get();
  const ServerBackend& backend = ctx.backend_for(call.early);
  return backend.table->forward(backend.instance, &a);
}

cad_status_t call_server_backward(CadContext& ctx, const ServerCall& call, const CallShape& shape,
                                  const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  ServerViews views(call.part, shape, t, device);
  cad_attention_backward_args_v1_t a{};
  describe_server_call(a, call, shape, stream);
  a.q = views.q.get(), a.k = views.k.get(), a.v = views.v.get(), a.o = views.o.get(), a.lse = views.lse.get();
  a.d_o = views.d_o.get(), a.d_q = views.d_q.get(), a.d_k = views.d_k.get(), a.d_v = views.d_v.get();
  const ServerBackend& backend = ctx.backend_for(call.early);
  return backend.table->backward(backend.instance, &a);
}

ServerBatchTensors part_tensors(const ServerBatchTensors& whole, const BatchPart& part, const CallShape& shape) {
  const int64_t qb = shape.q_row_bytes(), kvb = shape.kv_row_bytes();
  ServerBatchTensors t;
  t.q = row_at(whole.q, part.q_row, qb), t.o = row_at(whole.o, part.q_row, qb);
  t.d_o = row_at(whole.d_o, part.q_row, qb), t.d_q = row_at(whole.d_q, part.q_row, qb);
  t.k = row_at(whole.k, part.kv_row, kvb), t.v = row_at(whole.v, part.kv_row, kvb);
  t.d_k = row_at(whole.d_k, part.kv_row, kvb), t.d_v = row_at(whole.d_v, part.kv_row, kvb);
  return t;
}

bool needs_lse_scratch(const CadPlan& plan) {
  return std::any_of(plan.server_calls.begin(), plan.server_calls.end(), [](const ServerCall& c) { return !c.whole; });
}

cad_status_t run_server_calls(CadContext& ctx, const CadPlan& plan, const CallShape& shape,
                              const ServerBatchTensors& whole, Calls which, bool backward, cad_device_v1_t device,
                              void* stream, float* lse_scratch, const LseMover& move_lse, std::string* message) {
  for (size_t i = 0; i < plan.server_calls.size(); ++i) {
    const ServerCall& call = plan.server_calls[i];
    if (call.early != (which == Calls::Early)) continue;
    ServerBatchTensors t = part_tensors(whole, call.part, shape);
    // LSE [Hq, T]: a part's columns are not one range of it, so a part's call gets an LSE of its own.
    float* part_lse = call.whole ? whole.lse : lse_scratch + int64_t{shape.num_q_heads} * call.part.q_row;
    t.lse = part_lse;
    if (backward && !call.whole) move_lse(call, i, part_lse, false);
    const cad_status_t status = backward ? call_server_backward(ctx, call, shape, t, device, stream)
                                         : call_server_forward(ctx, call, shape, t, device, stream);
    if (status != CAD_STATUS_OK) {
      const ServerBackend& backend = ctx.backend_for(call.early);
      const char* text = backend.table->last_error(backend.instance);
      *message = "server backend instance '" + backend.name + "': " + (text != nullptr ? text : "(no message)");
      return status;
    }
    if (!backward && !call.whole) move_lse(call, i, part_lse, true);
  }
  return CAD_STATUS_OK;
}

LseMover cpu_lse_mover(const CallShape& shape, int64_t batch_rows, float* batch_lse) {
  return [=](const ServerCall& call, size_t, float* part_lse, bool to_batch) {
    const int64_t n = call.part.q_rows, hq = shape.num_q_heads;
    if (to_batch) {
      copy_lse_columns(part_lse, n, 0, batch_lse, batch_rows, call.part.q_row, n, hq);
    } else {
      copy_lse_columns(batch_lse, batch_rows, call.part.q_row, part_lse, n, 0, n, hq);
    }
  };
}

void copy_lse_columns(const float* src, int64_t src_cols, int64_t src_first, float* dst, int64_t dst_cols,
                      int64_t dst_first, int64_t n, int64_t heads) {
  for (int64_t h = 0; h < heads; ++h) {
    if (n > 0) std::memcpy(dst + h * dst_cols + dst_first, src + h * src_cols + src_first, static_cast<size_t>(n) * 4);
  }
}

void exchange(Comm& comm, const Layout& layout, Direction direction, const std::vector<Part>& send,
              const std::vector<Part>& recv, CallStats& stats, Peers peers) {
  const int32_t me = comm.rank();
  const Transfer transfer = plan_transfer(layout, me, direction, send, recv, peers);
  // Staging buffers, left uninitialised: pack writes every byte that is sent, the transfer every byte
  // that is unpacked.
  const std::unique_ptr<std::byte[]> send_buffer(new std::byte[transfer.send_bytes]);
  const std::unique_ptr<std::byte[]> recv_buffer(new std::byte[transfer.recv_bytes]);
  Stopwatch watch;
  pack(layout, me, direction, send, transfer, send_buffer.get());
  stats.pack_ms += watch.lap_ms();
  comm.all_to_all_v(send_buffer.get(), transfer, recv_buffer.get());
  stats.exchange_ms += watch.lap_ms();
  unpack(layout, me, direction, recv, transfer, recv_buffer.get());
  stats.unpack_ms += watch.lap_ms();
  const size_t self = static_cast<size_t>(me);
  stats.bytes_sent += transfer.send_bytes - transfer.send_counts[self];
  stats.bytes_received += transfer.recv_bytes - transfer.recv_counts[self];
}

}  // namespace cad::cad_plugin
