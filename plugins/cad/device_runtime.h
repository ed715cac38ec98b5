// device_runtime.h -- what one CAD instance holds on its CUDA device for all its plans and calls (CUDA builds
// only): the communication stream, the pinned staging of the plans' table uploads, the events that join exchanges
// to the callers' streams, and the timing queues (gpu_timing.h). Created with the instance's first CUDA plan.
#pragma once

#include <cuda_runtime.h>

#include <deque>
#include <vector>

#include "context.h"
#include "gpu_timing.h"
#include "host_staging.h"

namespace cad::cad_plugin {

struct DeviceRuntime {
  int device = -1;
  cudaStream_t comm_stream = nullptr;
  kernels::HostStaging staging;  // the plans' table uploads: never a wait for the plan's stream (host_staging.h)
  cudaEvent_t ready = nullptr, done = nullptr;
  std::deque<ExchangeEvents> timed;  // enqueued exchanges, oldest first, until harvested
  std::vector<ExchangeEvents> spare;  // harvested, for reuse
  std::vector<cudaEvent_t> spare_done;  // the end events of exchanges joined later (Mover::start), for reuse
  std::deque<CallEvents> calls;         // timed calls, oldest first, until harvested
  CallEvents* current = nullptr;        // the call being enqueued (CallTimer), where its server calls are timed
  std::vector<cudaEvent_t> spare_timing;  // the call timing's events, for reuse
  ~DeviceRuntime() {
    if (ready != nullptr) cudaEventDestroy(ready);
    if (done != nullptr) cudaEventDestroy(done);
    for (cudaEvent_t e : spare_done) cudaEventDestroy(e);
    for (cudaEvent_t e : spare_timing) cudaEventDestroy(e);
    for (const CallEvents& c : calls) {
      for (cudaEvent_t e : {c.start, c.end}) cudaEventDestroy(e);
      for (auto [a, b] : c.server) cudaEventDestroy(a), cudaEventDestroy(b);
    }
    for (const ExchangeEvents& e : spare) destroy(e);
    for (const ExchangeEvents& e : timed) destroy(e);
    if (comm_stream != nullptr) cudaStreamDestroy(comm_stream);
  }
  static void destroy(const ExchangeEvents& e) {
    cudaEventDestroy(e.caller_ready);
    cudaEventDestroy(e.comm_start);
    cudaEventDestroy(e.comm_end);
  }
};

// The instance's runtime on `device`, made at the first call (an instance runs on one device: another is refused,
// INVALID_ARGUMENT naming both).
DeviceRuntime& runtime(CadContext& ctx, int device);

}  // namespace cad::cad_plugin
