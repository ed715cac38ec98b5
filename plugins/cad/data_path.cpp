// data_path.cpp -- see data_path.h.
#include "data_path.h"

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
  comm.all_to_all_v(send_buffer.get(), transfer, recv_buffer.get());
  stats.exchange_ms += watch.lap_ms();
  unpack(layout, me, direction, recv, transfer, recv_buffer.get());
  stats.unpack_ms += watch.lap_ms();
  const size_t self = static_cast<size_t>(me);
  stats.bytes_sent += transfer.send_bytes - transfer.send_counts[self];
  stats.bytes_received += transfer.recv_bytes - transfer.recv_counts[self];
}

}  // namespace cad::cad_plugin
