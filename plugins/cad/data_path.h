// data_path.h -- the pieces forward and backward share: tensor descriptors over CAD's own buffers,
// one timed exchange (pack -> all_to_all_v -> unpack), and calls into the server backend.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "context.h"
#include "exchange.h"

namespace cad::cad_plugin {

// A compact row-major CPU tensor descriptor over memory CAD owns. Not copyable: the descriptor
// points at its own shape array.
class TensorView {
 public:
  TensorView(void* data, std::vector<int64_t> shape, bool bf16, cad_device_v1_t device = {CAD_DEVICE_CPU, 0});
  TensorView(const TensorView&) = delete;
  TensorView& operator=(const TensorView&) = delete;
  TensorView(TensorView&& other) noexcept : shape_(std::move(other.shape_)), tensor_(other.tensor_) {
    tensor_.shape = shape_.data();
  }
  cad_tensor_v1_t* get() { return &tensor_; }

 private:
  std::vector<int64_t> shape_;
  cad_tensor_v1_t tensor_{};
};

class Stopwatch {
 public:
  double lap_ms() {
    const auto now = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(now - start_).count();
    start_ = now;
    return ms;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// CPU time of the whole process (all its threads): what a CPU server backend spends, independent of
// how many other processes share the cores.
class CpuStopwatch {
 public:
  double lap_ms();

 private:
  double start_ms_ = now_ms();
  static double now_ms();
};

// One exchange between owners and servers; adds its times and bytes (to and from other ranks) to
// `stats`.
void exchange(Comm& comm, const Layout& layout, Direction direction, const std::vector<Part>& send,
              const std::vector<Part>& recv, CallStats& stats);

// Row parts over raw memory.
Part rows(RunSet runs, void* data, int64_t row_bytes);
Part lse_columns(void* data, int64_t heads, int64_t rows);

// Runs `call` (a server backend forward/backward) and then agrees across ranks on its outcome, so
// that a failing server makes every rank fail (naming that rank) instead of leaving peers waiting.
// The call's time goes to stats.compute_ms / compute_cpu_ms, the agreement's (waiting for the slowest
// server) to stats.wait_ms.
template <class Call>
void run_on_server(CadContext& ctx, const char* what, CallStats& stats, Call&& call) {
  cad_status_t status = CAD_STATUS_OK;
  std::string message;
  Stopwatch wall;
  CpuStopwatch cpu;
  try {
    status = call();
    if (status != CAD_STATUS_OK) {
      message = "server backend instance '" + ctx.server.name + "': " + ctx.server.table->last_error(ctx.server.instance);
    }
  } catch (const plugin::Failure& f) {
    status = f.status();
    message = f.what();
  } catch (const std::bad_alloc&) {
    status = CAD_STATUS_OUT_OF_MEMORY;
    message = "out of memory";
  }
  stats.compute_ms += wall.lap_ms();
  stats.compute_cpu_ms += cpu.lap_ms();
  agree(*ctx.comm, status, message, what);
  stats.wait_ms += wall.lap_ms();
}

// This rank's server batch, wherever it lives (CPU vectors or device buffers); the gradients are used by
// the backward only.
struct ServerBatchTensors {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  void *d_o = nullptr, *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;
};

// Which of this rank's batches a server backend call runs: the server batch (the rows the exchange brings,
// layout.servers) or the tasks it runs in place on its own tensors (layout.own; ServerBatchTensors are then the
// owner's tensors: its tokens' rows).
enum class Batch { Served, Own };

// One call of the server backend on one of this rank's batches of `plan`: with the backend's own plan of the
// batch when it made one, else the batch's segment table. Returns the backend's status (its message is its
// last_error). The CPU and the CUDA data paths both call the backend through these.
cad_status_t call_server_forward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                 const ServerBatchTensors& t, cad_device_v1_t device, void* stream);
cad_status_t call_server_backward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                  const ServerBatchTensors& t, cad_device_v1_t device, void* stream);

// Throws `status`: `what` failed on `server`, with that instance's last_error (for run_on_server to report a
// call that is not ctx.server's, and for the CUDA path, which reports a failed call after draining).
[[noreturn]] void server_failed(const ServerBackend& server, cad_status_t status, const char* what);

// Byte vectors sized for server-batch tensors.
inline std::vector<std::byte> rows_buffer(int64_t rows, int64_t row_bytes) {
  return std::vector<std::byte>(static_cast<size_t>(rows * row_bytes));
}

}  // namespace cad::cad_plugin
