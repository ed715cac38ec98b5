// wire_device.cpp -- see wire_device.h.
#include "wire_device.h"

#include <algorithm>
#include <vector>

#include "cuda_check.h"
#include "device_plan.h"
#include "device_runtime.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

namespace {

// On the communication stream, joined to the caller's with events (and timed: stats.h ExchangeTimes).
class DeviceWire final : public Wire {
 public:
  DeviceWire(CadContext& ctx, cudaStream_t stream) : ctx_(ctx), stream_(stream), rt_(*ctx.device) {}
  DeviceWire(const DeviceWire&) = delete;
  DeviceWire& operator=(const DeviceWire&) = delete;
  // An exchange started but never finished (a call that failed in between) is joined here for its timing, so that
  // the runtime's queue of timed exchanges does not stop at it.
  ~DeviceWire() override {
    for (ExchangeEvents* e : unjoined_) {
      (void)cudaEventRecord(e->caller_ready, stream_);
      e->joined = true;
    }
  }

  // The all_to_all_v of `t` on the communication stream after the caller's work so far; its end is rt_.done and
  // the ticket's `done`. The caller joins it after other work (Mover::start): its timing events are handed out
  // here, caller_ready left to the join.
  void move(const std::byte* send, const Transfer& t, std::byte* recv, bool timed, WireTicket& ticket) override {
    ExchangeEvents* timing = timed ? begin_timing(rt_, ctx_.stats.gpu_exchange) : nullptr;
    check_cuda(cudaEventRecord(rt_.ready, stream_), "cudaEventRecord");
    if (timing != nullptr) {
      timing->joined = false;
      unjoined_.push_back(timing);
      ticket.timing = timing;
    }
    check_cuda(cudaStreamWaitEvent(rt_.comm_stream, rt_.ready, 0), "cudaStreamWaitEvent");
    if (timing != nullptr) check_cuda(cudaEventRecord(timing->comm_start, rt_.comm_stream), "cudaEventRecord");
    ctx_.comm->all_to_all_v(send, t, recv, rt_.comm_stream);
    check_cuda(cudaEventRecord(rt_.done, rt_.comm_stream), "cudaEventRecord");
    if (timing != nullptr) check_cuda(cudaEventRecord(timing->comm_end, rt_.comm_stream), "cudaEventRecord");
    cudaEvent_t done = done_event();
    ticket.done = done;
    check_cuda(cudaEventRecord(done, rt_.comm_stream), "cudaEventRecord");
  }

  void join(WireTicket& ticket) override {
    if (ticket.timing != nullptr) {
      unjoined_.erase(std::find(unjoined_.begin(), unjoined_.end(), ticket.timing));
      ticket.timing->joined = true;
      check_cuda(cudaEventRecord(ticket.timing->caller_ready, stream_), "cudaEventRecord");
      ticket.timing = nullptr;
    }
    if (ticket.done != nullptr) {
      const cudaEvent_t done = static_cast<cudaEvent_t>(ticket.done);
      check_cuda(cudaStreamWaitEvent(stream_, done, 0), "cudaStreamWaitEvent");
      rt_.spare_done.push_back(done);  // a later record does not change what this wait waits for
      ticket.done = nullptr;
    }
  }

 private:
  cudaEvent_t done_event() {
    if (!rt_.spare_done.empty()) {
      cudaEvent_t e = rt_.spare_done.back();
      rt_.spare_done.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }

  CadContext& ctx_;
  cudaStream_t stream_;
  DeviceRuntime& rt_;
  std::vector<ExchangeEvents*> unjoined_;  // timed exchanges moved here and not yet joined
};

// Through pinned host memory, where a communicator on host memory (MPI) reads and writes: each peer's bytes are
// copied from (to) where they lie on the device -- the same per-peer displacements NCCL would use -- into (from)
// consecutive staging ranges. Synchronous: the exchange is complete on the caller's stream when move() returns,
// and nothing runs beside it.
class StagedWire final : public Wire {
 public:
  StagedWire(CadContext& ctx, const DevicePlan& plan, cudaStream_t stream) : ctx_(ctx), plan_(plan), stream_(stream) {}

  void move(const std::byte* send, const Transfer& t, std::byte* recv, bool, WireTicket&) override {
    const size_t world = t.send_counts.size();
    if (t.send_bytes > plan_.staged_bytes || t.recv_bytes > plan_.staged_bytes) {
      fail(CAD_STATUS_INTERNAL, format("cad: a staged exchange of %llu / %llu bytes exceeds the plan's %zu-byte pinned "
                                       "staging buffers", static_cast<unsigned long long>(t.send_bytes),
                                       static_cast<unsigned long long>(t.recv_bytes), plan_.staged_bytes));
    }
    Transfer staged = t;
    for (size_t p = 0, s = 0, r = 0; p < world; s += t.send_counts[p], r += t.recv_counts[p], ++p) {
      staged.send_displs[p] = s;
      staged.recv_displs[p] = r;
      if (t.send_counts[p] > 0) {
        check_cuda(cudaMemcpyAsync(static_cast<std::byte*>(plan_.pinned_send) + s, send + t.send_displs[p],
                                   t.send_counts[p], cudaMemcpyDeviceToHost, stream_), "staging D2H");
      }
    }
    check_cuda(cudaStreamSynchronize(stream_), "waiting for the staged send buffer");
    ctx_.comm->all_to_all_v(static_cast<const std::byte*>(plan_.pinned_send), staged,
                            static_cast<std::byte*>(plan_.pinned_recv));
    for (size_t p = 0; p < world; ++p) {
      if (t.recv_counts[p] > 0) {
        check_cuda(cudaMemcpyAsync(recv + t.recv_displs[p], static_cast<std::byte*>(plan_.pinned_recv) + staged.recv_displs[p],
                                   t.recv_counts[p], cudaMemcpyHostToDevice, stream_), "staging H2D");
      }
    }
  }

 private:
  CadContext& ctx_;
  const DevicePlan& plan_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<Wire> make_device_wire(CadContext& ctx, DevicePlan& plan, cudaStream_t stream) {
  if (ctx.host_staged) return std::make_unique<StagedWire>(ctx, plan, stream);
  return std::make_unique<DeviceWire>(ctx, stream);
}

}  // namespace cad::cad_plugin
