// gpu_timing.cpp -- see gpu_timing.h.
#include "gpu_timing.h"

#include <algorithm>
#include <functional>

#include "device_path.h"
#include "device_runtime.h"

namespace cad::cad_plugin {

namespace {

// Folds the completed exchanges at the front of `rt.timed` into `times`; stops at the first still running (or not
// yet joined by its caller).
void harvest(DeviceRuntime& rt, ExchangeTimes& times) {
  while (!rt.timed.empty()) {
    const ExchangeEvents e = rt.timed.front();
    if (!e.joined) break;
    cudaError_t state = cudaEventQuery(e.comm_end);
    if (state == cudaSuccess) state = cudaEventQuery(e.caller_ready);
    if (state == cudaErrorNotReady) break;
    rt.timed.pop_front();
    if (state == cudaSuccess) {
      float comm = 0.0f, stall = 0.0f;
      if (cudaEventElapsedTime(&comm, e.comm_start, e.comm_end) == cudaSuccess &&
          cudaEventElapsedTime(&stall, e.caller_ready, e.comm_end) == cudaSuccess) {
        times.comm_ms += comm;
        times.stall_ms += std::max(stall, 0.0f);  // a caller joining after the end did not wait
        ++times.exchanges;
      }
    } else {
      (void)cudaGetLastError();  // a failed exchange reports itself through its call; here it is not counted
    }
    rt.spare.push_back(e);
  }
  times.pending = static_cast<int64_t>(rt.timed.size());
}

}  // namespace

// The events for the exchange about to be enqueued, or NULL when too many are pending (nobody reads stats).
ExchangeEvents* begin_timing(DeviceRuntime& rt, ExchangeTimes& times) {
  constexpr size_t kMaxPending = 4096;
  times.timed = true;
  if (rt.timed.size() >= kMaxPending) harvest(rt, times);
  if (rt.timed.size() >= kMaxPending) {
    ++times.untimed;
    return nullptr;
  }
  ExchangeEvents e;
  if (!rt.spare.empty()) {
    e = rt.spare.back();
    rt.spare.pop_back();
  } else if (cudaEventCreate(&e.caller_ready) != cudaSuccess || cudaEventCreate(&e.comm_start) != cudaSuccess ||
             cudaEventCreate(&e.comm_end) != cudaSuccess) {
    (void)cudaGetLastError();
    ++times.untimed;  // timing is best effort: never a reason for a call to fail
    return nullptr;
  }
  rt.timed.push_back(e);
  return &rt.timed.back();
}

namespace {

// A timing event from the runtime's spares or a new one; NULL when none can be made (timing is best effort).
cudaEvent_t timing_event(DeviceRuntime& rt) {
  cudaEvent_t e = nullptr;
  if (!rt.spare_timing.empty()) {
    e = rt.spare_timing.back();
    rt.spare_timing.pop_back();
  } else if (cudaEventCreate(&e) != cudaSuccess) {
    (void)cudaGetLastError();
    e = nullptr;
  }
  return e;
}

// A call's timing events back to the runtime's spares (NULL ones skipped).
void recycle(DeviceRuntime& rt, const CallEvents& c) {
  for (cudaEvent_t e : {c.start, c.end}) {
    if (e != nullptr) rt.spare_timing.push_back(e);
  }
  for (auto [a, b] : c.server) rt.spare_timing.push_back(a), rt.spare_timing.push_back(b);
}

// Folds the completed calls at the front of `rt.calls` into `times`; stops at the first still running.
void harvest_calls(DeviceRuntime& rt, CallTimes& times) {
  while (!rt.calls.empty()) {
    CallEvents& c = rt.calls.front();
    const cudaError_t state = cudaEventQuery(c.end);
    if (state == cudaErrorNotReady) break;
    float call = 0.0f, server = 0.0f, part = 0.0f;
    bool ok = state == cudaSuccess && cudaEventElapsedTime(&call, c.start, c.end) == cudaSuccess;
    for (auto [a, b] : c.server) {
      ok = ok && cudaEventElapsedTime(&part, a, b) == cudaSuccess;
      server += part;
    }
    if (ok) {
      (c.backward ? times.backward_ms : times.forward_ms) += call;
      (c.backward ? times.backward_server_ms : times.forward_server_ms) += server;
      ++(c.backward ? times.backwards : times.forwards);
    } else {
      (void)cudaGetLastError();  // a failed call reports itself; here it is not counted
    }
    recycle(rt, c);
    rt.calls.pop_front();
  }
  times.pending = static_cast<int64_t>(rt.calls.size());
}

// Runs a server backend call (enqueued on `stream`) between two timing events of the current CallTimer, if any.
cad_status_t timed_server(CadContext& ctx, void* stream, const std::function<cad_status_t()>& call) {
  DeviceRuntime* rt = ctx.device.get();
  CallEvents* current = rt != nullptr ? rt->current : nullptr;
  cudaEvent_t a = current != nullptr ? timing_event(*rt) : nullptr;
  cudaEvent_t b = a != nullptr ? timing_event(*rt) : nullptr;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool timed = false;
  if (b != nullptr) {
    timed = cudaEventRecord(a, s) == cudaSuccess;
    if (!timed) (void)cudaGetLastError();  // only the timing's own failure is cleared, never the call's
  }
  const cad_status_t status = call();
  if (timed) {
    if (cudaEventRecord(b, s) == cudaSuccess) {
      current->server.emplace_back(a, b);
      return status;
    }
    (void)cudaGetLastError();
  }
  for (cudaEvent_t e : {a, b}) {
    if (e != nullptr) rt->spare_timing.push_back(e);
  }
  return status;
}

}  // namespace

CallTimer::CallTimer(CadContext& ctx, bool backward, cudaStream_t stream, bool drain) : stream_(stream) {
  constexpr size_t kMaxPending = 4096;
  if (drain || !ctx.device) return;
  rt_ = ctx.device.get();
  times_ = &ctx.stats.gpu_calls;
  times_->timed = true;
  if (rt_->calls.size() >= kMaxPending) harvest_calls(*rt_, *times_);
  if (rt_->calls.size() >= kMaxPending || (events_.start = timing_event(*rt_)) == nullptr) {
    ++times_->untimed;
    rt_ = nullptr;
    return;
  }
  events_.backward = backward;
  if (cudaEventRecord(events_.start, stream_) != cudaSuccess) {
    (void)cudaGetLastError();
    ++times_->untimed;
    rt_->spare_timing.push_back(events_.start);
    rt_ = nullptr;
    return;
  }
  rt_->current = &events_;
}

CallTimer::~CallTimer() {
  if (rt_ == nullptr) return;
  rt_->current = nullptr;
  events_.end = timing_event(*rt_);
  if (events_.end == nullptr || cudaEventRecord(events_.end, stream_) != cudaSuccess) {
    (void)cudaGetLastError();
    ++times_->untimed;
    recycle(*rt_, events_);
    return;
  }
  rt_->calls.push_back(std::move(events_));
}

// call_server_forward / call_server_backward (data_path.h), timed inside the current call.
cad_status_t timed_server_forward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                  const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  return timed_server(ctx, stream, [&] { return call_server_forward(ctx, plan, which, shape, t, device, stream); });
}
cad_status_t timed_server_backward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                   const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  return timed_server(ctx, stream, [&] { return call_server_backward(ctx, plan, which, shape, t, device, stream); });
}

void harvest_gpu_times(CadContext& ctx) {
  if (!ctx.device) return;
  harvest(*ctx.device, ctx.stats.gpu_exchange);
  harvest_calls(*ctx.device, ctx.stats.gpu_calls);
}

}  // namespace cad::cad_plugin
