// gpu_timing.h -- timing CAD's CUDA data path with CUDA events, never waiting for the GPU (CUDA builds only):
// each exchange's collective and the caller's stall on it (stats.h ExchangeTimes), each call and the server
// backend's compute inside it (stats.h CallTimes). The events wait in the runtime's queues (device_runtime.h) until
// harvest_gpu_times (device_path.h) finds them complete. Timing is best effort: it never makes a call fail.
#pragma once

#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "context.h"
#include "data_path.h"

namespace cad::cad_plugin {

struct DeviceRuntime;  // device_runtime.h

// Timing events of one exchange (stats.h: ExchangeTimes): the caller's stream where it waits for the exchange
// (`caller_ready`), the collective's start and end on the communication stream. An exchange joined later
// (Mover::start) records caller_ready only when the caller joins it (`joined`), after the work in between: its
// stall is then what the caller still waited.
struct ExchangeEvents {
  cudaEvent_t caller_ready = nullptr, comm_start = nullptr, comm_end = nullptr;
  bool joined = true;
};

// Timing events of one call on its stream (stats.h: CallTimes): its first and last enqueued work, and each server
// backend call inside it.
struct CallEvents {
  cudaEvent_t start = nullptr, end = nullptr;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> server;
  bool backward = false;
};

// The events for the exchange about to be enqueued (in the runtime's queue), or NULL when too many are pending
// (nobody reads stats) or none can be made.
ExchangeEvents* begin_timing(DeviceRuntime& rt, ExchangeTimes& times);

// Times one call of the CUDA data path on its stream from construction (before its first enqueued work) to
// destruction (after its last), and the server backend calls run through timed_server meanwhile. Drained calls and
// calls beyond the pending limit are not timed.
class CallTimer {
 public:
  CallTimer(CadContext& ctx, bool backward, cudaStream_t stream, bool drain);
  ~CallTimer();
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

 private:
  cudaStream_t stream_;
  DeviceRuntime* rt_ = nullptr;
  CallTimes* times_ = nullptr;
  CallEvents events_;
};

// call_server_forward / call_server_backward (data_path.h), timed inside the current call.
cad_status_t timed_server_forward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                  const ServerBatchTensors& t, cad_device_v1_t device, void* stream);
cad_status_t timed_server_backward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                   const ServerBatchTensors& t, cad_device_v1_t device, void* stream);

}  // namespace cad::cad_plugin
