// data_path.h -- the pieces forward and backward share: tensor descriptors over CAD's own buffers,
// one timed exchange (pack -> all_to_all_v -> unpack), and calls into the server backend.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "context.h"
#include "exchange.h"
#include "plan.h"

namespace cad::cad_plugin {

void run_forward(CadContext& ctx, const cad_attention_forward_args_v1_t* args);
void run_backward(CadContext& ctx, const cad_attention_backward_args_v1_t* args);

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
// `stats`. `peers`: Others leaves this rank's rows to itself out (moved by exchange_self instead).
void exchange(Comm& comm, const Layout& layout, Direction direction, const std::vector<Part>& send,
              const std::vector<Part>& recv, CallStats& stats, Peers peers = Peers::All);

// Row parts over raw memory.
Part rows(RunSet runs, void* data, int64_t row_bytes);
Part lse_columns(void* data, int64_t heads, int64_t rows);

// The server backend calls of one CAD call on the host-side paths: their time (stats.compute_ms /
// compute_cpu_ms), the first failure (the calls after it are skipped), then one agreement across ranks on the
// outcome (stats.wait_ms: waiting for the slowest server), so that a failing server makes every rank fail
// (naming that rank) instead of leaving peers waiting. run() may be called several times (the local part
// before the exchange, the rest after it); agree() once, by every rank.
class ServerCompute {
 public:
  ServerCompute(CadContext& ctx, CallStats& stats) : ctx_(ctx), stats_(stats) {}

  // `call(std::string* message)` returns a status, and on failure says why in *message.
  template <class Call>
  void run(Call&& call) {
    if (status_ != CAD_STATUS_OK) return;
    Stopwatch wall;
    CpuStopwatch cpu;
    try {
      status_ = call(&message_);
    } catch (const plugin::Failure& f) {
      status_ = f.status();
      message_ = f.what();
    } catch (const std::bad_alloc&) {
      status_ = CAD_STATUS_OUT_OF_MEMORY;
      message_ = "out of memory";
    }
    stats_.compute_ms += wall.lap_ms();
    stats_.compute_cpu_ms += cpu.lap_ms();
  }

  void agree(const char* what) {
    Stopwatch wall;
    cad::cad_plugin::agree(*ctx_.comm, status_, message_, what);
    stats_.wait_ms += wall.lap_ms();
  }

 private:
  CadContext& ctx_;
  CallStats& stats_;
  cad_status_t status_ = CAD_STATUS_OK;
  std::string message_;
};

// This rank's server batch, wherever it lives (CPU vectors or device buffers); the gradients are used by
// the backward only.
struct ServerBatchTensors {
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  void *d_o = nullptr, *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;
};

// One server backend call (plan.h ServerCall) on its part of this rank's batch: `t` holds the part's rows
// (part_tensors) and an LSE [Hq, part rows] of its own. With the backend's own plan of the part when it made one,
// else the part's segments. Returns the backend's status (its message is its last_error).
cad_status_t call_server_forward(CadContext& ctx, const ServerCall& call, const CallShape& shape,
                                 const ServerBatchTensors& t, cad_device_v1_t device, void* stream);
cad_status_t call_server_backward(CadContext& ctx, const ServerCall& call, const CallShape& shape,
                                  const ServerBatchTensors& t, cad_device_v1_t device, void* stream);

// The rows of a server batch's tensors (`whole`) that `part` covers: Q-shaped ones from row part.q_row, K-shaped
// ones from part.kv_row. `lse` is not a row range of the batch's LSE [Hq, T] (see run_server_calls): NULL here.
ServerBatchTensors part_tensors(const ServerBatchTensors& whole, const BatchPart& part, const CallShape& shape);

// Which of a plan's server calls run: Early, before the exchange of the other owners' rows completes (the
// local parts, where the plan computes them first: CadPlan::local_first); Late, the others after it (all of
// them without local_first).
enum class Calls { Early, Late };

// Copies one server call's LSE columns between the batch's LSE [Hq, T] and the call's own [Hq, part rows]
// (`part_lse`): into the batch (`to_batch`, after a forward) or out of it (before a backward). The CPU and the
// CUDA paths each bring theirs.
using LseMover = std::function<void(const ServerCall& call, size_t index, float* part_lse, bool to_batch)>;

// Runs the plan's server calls of `which`, in batch order, forward or `backward`, each on its rows of `whole`
// and its backend (CadContext::backend_for); stops at the first failure and returns its status, `message`
// then naming the backend instance and saying what it said. A call over the whole batch uses whole.lse itself; any
// other call's LSE lives in `lse_scratch` (Hq x batch rows floats, the call's [Hq, rows] at Hq * part.q_row)
// and is moved by `move_lse`. All calls share `device` and `stream`.
cad_status_t run_server_calls(CadContext& ctx, const CadPlan& plan, const CallShape& shape,
                              const ServerBatchTensors& whole, Calls which, bool backward, cad_device_v1_t device,
                              void* stream, float* lse_scratch, const LseMover& move_lse, std::string* message);

// Whether run_server_calls needs its LSE scratch (some call covers part of the batch only).
bool needs_lse_scratch(const CadPlan& plan);

// The CPU path's LseMover: a call's columns of the batch's LSE [Hq, batch_rows] at `batch_lse`.
LseMover cpu_lse_mover(const CallShape& shape, int64_t batch_rows, float* batch_lse);

// CPU LSE columns: dst[h, dst_first + i] = src[h, src_first + i] for i < n, h < heads, over row-major [heads,
// src_cols] and [heads, dst_cols].
void copy_lse_columns(const float* src, int64_t src_cols, int64_t src_first, float* dst, int64_t dst_cols,
                      int64_t dst_first, int64_t n, int64_t heads);

// Byte vectors sized for server-batch tensors.
inline std::vector<std::byte> rows_buffer(int64_t rows, int64_t row_bytes) {
  return std::vector<std::byte>(static_cast<size_t>(rows * row_bytes));
}

}  // namespace cad::cad_plugin
