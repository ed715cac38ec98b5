// device_path.cpp -- see device_path.h. Built only with CUDA (device_path_none.cpp otherwise).
#include "device_path.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <vector>

#include "cad_kernels.h"
#include "cuda_check.h"
#include "data_path.h"
#include "host_staging.h"
#include "wire_tables.h"

namespace cad::cad_plugin {

using kernels::RowCopy;
using plugin::fail;
using plugin::format;

namespace {

// Device memory from the host's allocate service, handed back in stream order on `stream`.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

DeviceBuffer allocate(CadContext& ctx, int device, size_t bytes, void* stream, const char* what) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cad_host_services_v1_t* s = ctx.logger.services();
  if (s->allocate(s->host_ctx, {CAD_DEVICE_CUDA, device}, bytes, stream, &b.ptr) != CAD_STATUS_OK || b.ptr == nullptr) {
    fail(CAD_STATUS_OUT_OF_MEMORY, format("cad: the host could not allocate %zu bytes of device memory for %s", bytes, what));
  }
  b.bytes = bytes;
  return b;
}

void release(CadContext& ctx, int device, DeviceBuffer& b, void* stream) {
  if (b.ptr == nullptr) return;
  const cad_host_services_v1_t* s = ctx.logger.services();
  s->free(s->host_ctx, {CAD_DEVICE_CUDA, device}, b.ptr, stream);
  b.ptr = nullptr;
}

// One index table (wire_tables.h) in the plan's device arrays.
struct Table {
  int64_t offset = 0;  // first entry in the plan's device table arrays
  int64_t count = 0;
  std::vector<int64_t> peer_row;    // per peer: its first row (wire_tables.h)
  std::vector<bool> peer_direct;    // per peer: its rows are one contiguous range, from peer_row
  bool exclusive = false;           // owner KV: dK/dV rows come back from one server each (no sum)
  std::vector<int64_t> peer_first;  // per peer: first entry, relative to offset (world + 1 entries)
};

enum TableId {
  OwnerQ, OwnerKv, ServerQ, ServerKv,
  OwnerKvSingle,  // owner-side dK/dV rows read by one server: moved (the others are summed, wire_tables.h)
  kNumTables
};

}  // namespace

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

// Times one call of the CUDA data path on its stream from construction (before its first enqueued work) to
// destruction (after its last), and the server backend calls run through timed_server meanwhile. Drained calls and
// calls beyond the pending limit are not timed.
class CallTimer {
 public:
  CallTimer(CadContext& ctx, bool backward, cudaStream_t stream, bool drain) : stream_(stream) {
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
  ~CallTimer() {
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
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

 private:
  cudaStream_t stream_;
  DeviceRuntime* rt_ = nullptr;
  CallTimes* times_ = nullptr;
  CallEvents events_;
};

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

// call_server_forward / call_server_backward (data_path.h), timed inside the current call.
cad_status_t timed_server_forward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                  const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  return timed_server(ctx, stream, [&] { return call_server_forward(ctx, plan, which, shape, t, device, stream); });
}
cad_status_t timed_server_backward(CadContext& ctx, const CadPlan& plan, Batch which, const CallShape& shape,
                                   const ServerBatchTensors& t, cad_device_v1_t device, void* stream) {
  return timed_server(ctx, stream, [&] { return call_server_backward(ctx, plan, which, shape, t, device, stream); });
}

}  // namespace

void harvest_gpu_times(CadContext& ctx) {
  if (!ctx.device) return;
  harvest(*ctx.device, ctx.stats.gpu_exchange);
  harvest_calls(*ctx.device, ctx.stats.gpu_calls);
}

void DeviceRuntimeDeleter::operator()(DeviceRuntime* runtime) const { delete runtime; }

struct DevicePlan {
  int device = 0;
  void* stream = nullptr;  // the allocation stream (resources go back on it)
  // Per table, two directions of the same pairs: "to_wire" (tensor row -> wire row) and "from_wire".
  Table tables[kNumTables];
  DeviceBuffer to_wire, from_wire;  // RowCopy arrays, one per direction, tables at their offsets
  // Rows on the wire per peer: owner side (to / from each server) and server side (from / to each owner).
  std::vector<int64_t> owner_q_rows, owner_kv_rows, server_q_rows, server_kv_rows;
  void* pinned_send = nullptr;         // host-staged mode only: staged_bytes each
  void* pinned_recv = nullptr;
  size_t staged_bytes = 0;             // the largest exchange's bytes (it moves several tensors)
  WorkspaceSizes sizes;                // of the per-call buffers (CallScratch)
  DeviceBuffer sum_index;  // owner-side dK/dV rows read by several servers (wire_tables.h: shared_*)
  int64_t shared_kv_rows = 0;
  bool own_in_place = false;  // this rank runs tasks in place (layout.own): returning dK/dV rows are added
  // The server batch runs a head group at a time, its rows moving group by group (device_path.h): laid out group
  // after group, [G][rows][H/G][D] (its LSE [G][H/G][rows], i.e. [H][rows] as ungrouped).
  int32_t head_groups = 1;
  bool bf16 = false;  // the calls' dtype (else fp32): the dK/dV sums' element
  // The tables are uploaded in the order of the plan's stream through the runtime's pinned staging, without
  // waiting on the host (a plan made ahead on another thread must not wait for the training stream to drain,
  // and it holds the instance's lock while it uploads); `ready` marks the uploads' end for calls on other
  // streams.
  cudaEvent_t ready = nullptr;

  // Every device buffer the plan holds (allocated, counted and released through this one list). The wire
  // staging and the server batch's scratch are not here: a call takes them from the host's allocator and
  // gives them back when it ends (CallScratch), so a plan made ahead, or one of two ping-pong plans, holds
  // no more than its index tables, and between calls the memory serves the application.
  std::array<DeviceBuffer*, 3> buffers() { return {&to_wire, &from_wire, &sum_index}; }
};

// The device memory one call works in: each exchange's send and receive buffers and the server batch's scratch,
// from the host's allocator on the call's stream, given back in that stream's order where the call no longer needs
// them or when it ends. Every exchange on the communication stream is joined back to the call's
// stream before the call returns, so that stream-ordered release cannot hand memory to later work too early.
class CallScratch {
 public:
  CallScratch(CadContext& ctx, const DevicePlan& plan, void* stream) : ctx_(ctx), plan_(plan), stream_(stream) {}
  CallScratch(const CallScratch&) = delete;
  CallScratch& operator=(const CallScratch&) = delete;
  ~CallScratch() {
    for (DeviceBuffer& b : owned_) release(ctx_, plan_.device, b, stream_);
  }

  void* take(size_t bytes, const char* what) {
    owned_.push_back(allocate(ctx_, plan_.device, bytes, stream_, what));
    count(bytes);
    return owned_.back().ptr;
  }
  // Gives one buffer from take() back now, where the rest of the call no longer needs it (in stream order:
  // the work enqueued on it so far runs first).
  void give_back(void* ptr) {
    for (DeviceBuffer& b : owned_) {
      if (b.ptr == ptr && ptr != nullptr) {
        live_ -= b.bytes;
        release(ctx_, plan_.device, b, stream_);
      }
    }
  }
  int64_t peak_bytes() const { return static_cast<int64_t>(peak_); }

 private:
  void count(size_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  CadContext& ctx_;
  const DevicePlan& plan_;
  void* stream_;
  std::vector<DeviceBuffer> owned_;
  size_t live_ = 0, peak_ = 0;  // bytes held now and at most during the call
};

struct DeviceSaved {
  int device = 0;
  void* stream = nullptr;  // the stream of the last call that used it
  DeviceBuffer q, k, v, o, lse;
  // The owner's own tensors for the tasks it runs in place (its backward may be handed stand-ins for q/k/v/o).
  DeviceBuffer own_q, own_k, own_v, own_o, own_lse;
  std::array<DeviceBuffer*, 10> buffers() {
    return {&q, &k, &v, &o, &lse, &own_q, &own_k, &own_v, &own_o, &own_lse};
  }
};

// Bytes of device memory in a list of buffers.
template <size_t N>
int64_t total_bytes(const std::array<DeviceBuffer*, N>& buffers) {
  int64_t bytes = 0;
  for (const DeviceBuffer* b : buffers) bytes += static_cast<int64_t>(b->bytes);
  return bytes;
}

void DeviceSavedDeleter::operator()(DeviceSaved* saved) const {
  if (saved == nullptr) return;
  for (DeviceBuffer* b : saved->buffers()) release(*ctx, saved->device, *b, saved->stream);
  delete saved;
}

bool device_path_available() { return true; }

void check_call_stream(void* stream, int device_id, const char* what) {
  // A stream being captured into a graph cannot be asked for its device; it was checked when the eager
  // calls ran (a capture replays what an eager call does).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (stream != nullptr && cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) == cudaSuccess &&
      capture != cudaStreamCaptureStatusNone) {
    return;
  }
  cudaGetLastError();
  int device = -1;
  const cudaError_t err = stream != nullptr ? cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device)
                                            : cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: stream: not a usable CUDA stream (%s)", what, cudaGetErrorString(err)));
  }
  if (device != device_id) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: stream: it belongs to CUDA device %d but the tensors are on device %d",
                                             what, device, device_id));
  }
}

int64_t device_plan_bytes(DevicePlan& plan) { return total_bytes(plan.buffers()); }

namespace {

static_assert(sizeof(WireCopy) == sizeof(RowCopy) && offsetof(WireCopy, num_rows) == offsetof(RowCopy, num_rows),
              "the wire tables are uploaded as the kernels' RowCopy arrays");

// Appends one wire table to the plan's host arrays; returns where it lies.
Table append_table(const WireTable& w, std::vector<RowCopy>& to_wire, std::vector<RowCopy>& from_wire,
                   std::vector<int64_t>& rows_per_peer) {
  Table t;
  t.offset = static_cast<int64_t>(to_wire.size());
  t.count = static_cast<int64_t>(w.to_wire.size());
  t.peer_row = w.peer_row;
  t.peer_direct = w.peer_direct;
  t.exclusive = w.exclusive;
  t.peer_first = w.peer_first;
  for (const WireCopy& c : w.to_wire) to_wire.push_back(RowCopy{c.src_row, c.dst_row, c.num_rows});
  for (const WireCopy& c : w.from_wire) from_wire.push_back(RowCopy{c.src_row, c.dst_row, c.num_rows});
  rows_per_peer = w.rows_per_peer;
  return t;
}

DeviceRuntime& runtime(CadContext& ctx, int device) {
  if (ctx.device && ctx.device->device == device) return *ctx.device;
  if (ctx.device) fail(CAD_STATUS_INVALID_ARGUMENT, format("cad: this instance runs on CUDA device %d, not %d",
                                                           ctx.device->device, device));
  auto rt = std::unique_ptr<DeviceRuntime, DeviceRuntimeDeleter>(new DeviceRuntime);
  rt->device = device;
  // The highest priority the device offers: when the exchange's kernels become ready while the caller's (or
  // the other nano-batch's) compute kernels fill the GPU, the block scheduler gives the exchange the next free
  // SMs instead of queueing it behind the compute; otherwise the exchange that ping-pong wants to hide is the
  // one that waits. Config comm_stream_priority "normal" keeps the default priority instead.
  int least_priority = 0, greatest_priority = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority), "cudaDeviceGetStreamPriorityRange");
  const int priority = ctx.config.comm_stream_highest_priority ? greatest_priority : 0;
  check_cuda(cudaStreamCreateWithPriority(&rt->comm_stream, cudaStreamNonBlocking, priority),
             "creating the communication stream");
  check_cuda(cudaEventCreateWithFlags(&rt->ready, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&rt->done, cudaEventDisableTiming), "cudaEventCreate");
  ctx.device = std::move(rt);
  return *ctx.device;
}

}  // namespace

DevicePlan* make_device_plan(CadContext& ctx, const Step& step, int32_t head_groups, void* stream) {
  const int device = step.shape.device_id;
  DeviceScope scope(device);
  DeviceRuntime& rt = runtime(ctx, device);
  std::unique_ptr<DevicePlan, DevicePlanDeleter> plan(new DevicePlan, DevicePlanDeleter{&ctx});
  plan->device = device;
  plan->stream = stream;
  plan->head_groups = head_groups;
  plan->bf16 = step.shape.bf16;
  const Layout& layout = step.layout;
  const int32_t me = ctx.comm->rank();
  std::vector<RowCopy> to_wire, from_wire;
  plan->tables[OwnerQ] = append_table(build_wire_table(layout, me, true, true), to_wire, from_wire, plan->owner_q_rows);
  // Where this rank runs tasks in place, their partial dK/dV are in its tensors before the servers' come back:
  // every returning row is added to them.
  plan->own_in_place = !layout.own[static_cast<size_t>(me)].segments.empty();
  const WireTable owner_kv = build_wire_table(layout, me, true, false, step.shape.tokens, plan->own_in_place);
  plan->tables[OwnerKv] = append_table(owner_kv, to_wire, from_wire, plan->owner_kv_rows);
  // The dK/dV return lists go into both arrays at the same offsets (only one direction is used).
  auto append_list = [&](const std::vector<WireCopy>& copies, const std::vector<int64_t>& peer_first) {
    Table t;
    t.offset = static_cast<int64_t>(to_wire.size());
    t.count = static_cast<int64_t>(copies.size());
    t.peer_first = peer_first;
    for (const WireCopy& c : copies) {
      to_wire.push_back(RowCopy{c.src_row, c.dst_row, c.num_rows});
      from_wire.push_back(RowCopy{c.src_row, c.dst_row, c.num_rows});
    }
    return t;
  };
  plan->tables[OwnerKvSingle] = append_list(owner_kv.single, {});
  plan->shared_kv_rows = owner_kv.shared_rows;
  // The shared rows' sum index, one array: owner rows [n], first contribution [n + 1], wire rows [m].
  std::vector<int64_t> sum_index = owner_kv.shared_owner_rows;
  sum_index.insert(sum_index.end(), owner_kv.shared_first.begin(), owner_kv.shared_first.end());
  sum_index.insert(sum_index.end(), owner_kv.shared_wire_rows.begin(), owner_kv.shared_wire_rows.end());
  plan->tables[ServerQ] = append_table(build_wire_table(layout, me, false, true), to_wire, from_wire, plan->server_q_rows);
  plan->tables[ServerKv] = append_table(build_wire_table(layout, me, false, false), to_wire, from_wire,
                                        plan->server_kv_rows);
  const size_t table_bytes = to_wire.size() * sizeof(RowCopy);
  plan->to_wire = allocate(ctx, device, table_bytes, stream, "the plan's index tables");
  plan->from_wire = allocate(ctx, device, table_bytes, stream, "the plan's index tables");
  const auto upload = [&](void* dst, const void* src, size_t bytes, const char* what) {
    check_cuda(rt.staging.copy(dst, src, bytes, static_cast<cudaStream_t>(stream)), what);
  };
  upload(plan->to_wire.ptr, to_wire.data(), table_bytes, "uploading the plan's index tables");
  upload(plan->from_wire.ptr, from_wire.data(), table_bytes, "uploading the plan's index tables");

  const WorkspaceSizes sizes = workspace_sizes(layout, me, step.shape, ctx.config.keep_forward_tensors,
                                               static_cast<int64_t>(to_wire.size()),
                                               static_cast<int64_t>(sum_index.size()));
  plan->sizes = sizes;
  // The host-staged pinned buffers hold a call's largest exchange, a backward that re-sends its forward's tensors
  // included: workspace_sizes' `wire` without kept state (tested as a bound on every exchange the calls place).
  plan->staged_bytes = static_cast<size_t>(
      workspace_sizes(layout, me, step.shape, /*keep_forward_tensors=*/false, 0, 0).wire);
  if (ctx.host_staged && plan->staged_bytes > 0) {
    check_cuda(cudaHostAlloc(&plan->pinned_send, plan->staged_bytes, cudaHostAllocDefault), "cudaHostAlloc (staging)");
    check_cuda(cudaHostAlloc(&plan->pinned_recv, plan->staged_bytes, cudaHostAllocDefault), "cudaHostAlloc (staging)");
  }
  if (owner_kv.shared_rows > 0) {
    plan->sum_index = allocate(ctx, device, static_cast<size_t>(sizes.sum_index), stream, "the dK/dV sum index");
    upload(plan->sum_index.ptr, sum_index.data(), static_cast<size_t>(sizes.sum_index), "uploading the sum index");
  }
  check_cuda(cudaEventCreateWithFlags(&plan->ready, cudaEventDisableTiming), "creating the plan's ready event");
  check_cuda(cudaEventRecord(plan->ready, static_cast<cudaStream_t>(stream)), "recording the plan's uploads");
  return plan.release();
}

void release_device_plan(CadContext& ctx, DevicePlan* plan) {
  if (plan == nullptr) return;
  for (DeviceBuffer* b : plan->buffers()) release(ctx, plan->device, *b, plan->stream);
  // Pinned staging is only used inside host-synchronised exchanges: nothing can still read it.
  if (plan->pinned_send != nullptr) cudaFreeHost(plan->pinned_send);
  if (plan->pinned_recv != nullptr) cudaFreeHost(plan->pinned_recv);
  if (plan->ready != nullptr) cudaEventDestroy(plan->ready);  // released once its work completes
  delete plan;
}

namespace {

// One call's view of the plan: the exchange primitives over its tables and buffers.
class Mover {
 public:
  Mover(CadContext& ctx, DevicePlan& plan, CallScratch& scratch, cudaStream_t stream, bool drain, CallStats& stats)
      : ctx_(ctx), plan_(plan), scratch_(scratch), stream_(stream), drain_(drain), stats_(stats), rt_(*ctx.device) {}
  Mover(const Mover&) = delete;
  Mover& operator=(const Mover&) = delete;
  // After a failure: the exchanges still run (the peers wait for them), nothing more is packed or unpacked.
  void stop_writing() { drain_ = true; }
  // An exchange started but never finished (a call that failed in between) is joined here for its timing, so that
  // the runtime's queue of timed exchanges does not stop at it.
  ~Mover() {
    for (ExchangeEvents* e : unjoined_) {
      (void)cudaEventRecord(e->caller_ready, stream_);
      e->joined = true;
    }
  }

  // One tensor's share of an exchange started with start(): `row_bytes` bytes of each row, rows `src_stride` /
  // `dst_stride` bytes apart -- whole rows (all three equal), or a head group's (DevicePlan::head_groups:
  // a slice of the owner's full rows, the server batch's group rows whole). An LSE slice (`lse`) is a group's heads
  // of [H, rows] fp32 instead: src / dst at its first head, row_bytes = heads * 4, and the strides are the two
  // tensors' row counts (their head strides).
  struct Slice {
    RunSet set;
    const void* src;
    void* dst;
    int64_t row_bytes;
    int64_t src_stride, dst_stride;
    bool lse = false;
  };
  // An exchange enqueued on the communication stream and joined to the caller's stream only by finish(): the
  // caller enqueues other work (the server batch's previous head group) in between.
  struct InFlight {
    Direction direction = Direction::ToServers;
    std::vector<Slice> slices;
    bool kv_sums = false;  // one dK or dV slice to its owners: a row read by one server moved, by several summed
    std::byte* send = nullptr;
    std::byte* recv = nullptr;
    std::vector<std::vector<uint64_t>> recv_at;  // per slice and peer: where its rows start in `recv`
    std::vector<bool> self_direct;               // per slice: this rank's own rows copied by start() (no buffer)
    cudaEvent_t done = nullptr;
    ExchangeEvents* timing = nullptr;  // in the runtime's queue until finish() joins it, or NULL (untimed)
  };

  // Packs the slices' rows for the other ranks into one send buffer (per peer: each slice's rows in turn,
  // place_wire_parts) and enqueues their all_to_all_v; the receiving side is unpacked by finish(). The rows a rank
  // sends itself never travel: beside the collective they are copied from the source tensor straight into the
  // destination where one side holds them as one range (`self_direct`), else (LSE, summed dK/dV) packed into the
  // receive buffer's place for them and unpacked with the rest.
  InFlight start(Direction direction, std::vector<Slice> slices, bool kv_sums = false) {
    const bool to_servers = direction == Direction::ToServers;
    InFlight f;
    f.direction = direction;
    f.slices = std::move(slices);
    f.kv_sums = kv_sums;
    std::vector<WirePart> parts;
    for (const Slice& slice : f.slices) {
      f.self_direct.push_back(self_direct(slice, to_servers, kv_sums));
      parts.push_back(WirePart{slice.row_bytes, &wire_rows(slice.set, to_servers), &wire_rows(slice.set, !to_servers),
                               f.self_direct.back()});
    }
    WirePlacement placed = place_wire_parts(parts, static_cast<int32_t>(plan_.owner_q_rows.size()), ctx_.comm->rank());
    const Transfer& t = placed.transfer;
    const std::vector<std::vector<uint64_t>>& send_at = placed.send_at;
    f.recv_at = std::move(placed.recv_at);
    f.send = t.send_bytes > 0 ? static_cast<std::byte*>(scratch_.take(t.send_bytes, "the send buffer")) : nullptr;
    f.recv = t.recv_bytes > 0 ? static_cast<std::byte*>(scratch_.take(t.recv_bytes, "the receive buffer")) : nullptr;
    for (size_t i = 0; i < f.slices.size() && !drain_; ++i) {
      copy_slice(f.slices[i], /*pack=*/true, to_servers, f.send, send_at[i], Peers::Others);
    }
    enqueue_transfer(f.send, t, f.recv, &f.timing);
    if (!ctx_.host_staged) {  // a staged exchange is complete on the caller's stream already
      f.done = done_event();
      check_cuda(cudaEventRecord(f.done, rt_.comm_stream), "cudaEventRecord");
    }
    for (size_t i = 0; i < f.slices.size() && !drain_; ++i) {  // this rank's own rows, while the others travel
      if (f.self_direct[i]) {
        copy_self(f.slices[i], to_servers);
      } else {
        copy_slice(f.slices[i], /*pack=*/true, to_servers, f.recv, f.recv_at[i], Peers::Self);
      }
    }
    return f;
  }

  // Joins `f` to the caller's stream, unpacks its slices into their tensors and gives its buffers back.
  void finish(InFlight& f) {
    if (f.timing != nullptr) {
      unjoined_.erase(std::find(unjoined_.begin(), unjoined_.end(), f.timing));
      f.timing->joined = true;
      check_cuda(cudaEventRecord(f.timing->caller_ready, stream_), "cudaEventRecord");
      f.timing = nullptr;
    }
    if (f.done != nullptr) {
      check_cuda(cudaStreamWaitEvent(stream_, f.done, 0), "cudaStreamWaitEvent");
      rt_.spare_done.push_back(f.done);  // a later record does not change what this wait waits for
      f.done = nullptr;
    }
    const bool owner_side = f.direction == Direction::ToOwners;  // the receiving side
    for (size_t i = 0; i < f.slices.size() && !drain_; ++i) {
      if (f.kv_sums && !plan_.tables[table_of(f.slices[i].set, owner_side)].exclusive) {
        sum_kv_rows(f.recv, f.slices[i]);  // the recv buffer holds this one slice, in wire order
      } else {
        copy_slice(f.slices[i], /*pack=*/false, owner_side, f.recv, f.recv_at[i],
                   f.self_direct[i] ? Peers::Others : Peers::All);
      }
    }
    scratch_.give_back(f.send);
    scratch_.give_back(f.recv);
    f.send = f.recv = nullptr;
  }

 private:
  // One slice's rows between its tensor and an exchange buffer, peer by peer: `pack` (s.src -> buffer, with the
  // sending side's table) or unpack (buffer -> s.dst, with the receiving side's); `owner_side`: that side is the
  // owners'. A table's copies for peer p address the slice's own wire rows, which start after the rows of the peers
  // before p, so the buffer shifted back by those puts them at the slice's place in p's range (`at[p]`).
  enum class Peers { All, Others, Self };  // which peers' rows copy_slice copies (Self: this rank's own)
  void copy_slice(const Slice& s, bool pack, bool owner_side, std::byte* buffer, const std::vector<uint64_t>& at,
                  Peers peers) {
    const Table& table = plan_.tables[table_of(s.set, owner_side)];
    const std::vector<int64_t>& rows = wire_rows(s.set, owner_side);
    const size_t me = static_cast<size_t>(ctx_.comm->rank());
    const int64_t heads = s.row_bytes / static_cast<int64_t>(sizeof(float));  // an LSE slice's
    for (size_t p = 0; p < rows.size(); ++p) {
      if ((peers == Peers::Others && p == me) || (peers == Peers::Self && p != me)) continue;
      const RowCopy* copies = (pack ? to_wire(table) : from_wire(table)) + table.peer_first[p];
      const int64_t n = table.peer_first[p + 1] - table.peer_first[p];
      const int64_t wire_row = wire_rows_before(rows, static_cast<int32_t>(p));
      std::byte* base = offset(buffer, static_cast<int64_t>(at[p]) - wire_row * s.row_bytes);
      float* wire_lse = reinterpret_cast<float*>(base);
      cudaError_t e;
      if (pack) {
        e = s.lse ? kernels::copy_strided_rows_f32(static_cast<const float*>(s.src), 1, s.src_stride, wire_lse, heads,
                                                   1, heads, copies, n, stream_)
                  : kernels::copy_row_slices(s.src, s.src_stride, base, s.row_bytes, s.row_bytes, copies, n, stream_);
      } else {
        e = s.lse ? kernels::copy_strided_rows_f32(wire_lse, heads, 1, static_cast<float*>(s.dst), 1, s.dst_stride,
                                                   heads, copies, n, stream_)
                  : kernels::copy_row_slices(base, s.row_bytes, s.dst, s.dst_stride, s.row_bytes, copies, n, stream_);
      }
      check_cuda(e, pack ? "pack (gather kernel)" : "unpack (scatter kernel)");
    }
  }

  // Can a slice's rows for this rank itself go straight from its source tensor to its destination? Where the
  // receiving side holds them as one range (packed into it with the sending side's table) or the sending side
  // does (unpacked from it with the receiving side's); not an LSE (a strided copy) nor dK/dV the owner sums.
  bool self_direct(const Slice& s, bool to_servers, bool kv_sums) const {
    const size_t me = static_cast<size_t>(ctx_.comm->rank());
    if (s.lse || (kv_sums && !plan_.tables[OwnerKv].exclusive)) return false;
    return plan_.tables[table_of(s.set, !to_servers)].peer_direct[me] ||
           plan_.tables[table_of(s.set, to_servers)].peer_direct[me];
  }
  // The self_direct copy of a slice's own rows (the table's copies address wire rows: the range's start is
  // shifted back by the wire rows of the peers before this rank, as copy_slice does with a buffer).
  void copy_self(const Slice& s, bool to_servers) {
    const int32_t rank = ctx_.comm->rank();
    const size_t me = static_cast<size_t>(rank);
    const Table& sender = plan_.tables[table_of(s.set, to_servers)];
    const Table& receiver = plan_.tables[table_of(s.set, !to_servers)];
    const auto wire_before = [&](bool owner_side) { return wire_rows_before(wire_rows(s.set, owner_side), rank); };
    cudaError_t e;
    if (receiver.peer_direct[me]) {
      const int64_t shift = receiver.peer_row[me] - wire_before(to_servers);
      e = kernels::copy_row_slices(s.src, s.src_stride, offset(static_cast<std::byte*>(s.dst), shift * s.dst_stride),
                                   s.dst_stride, s.row_bytes, to_wire(sender) + sender.peer_first[me],
                                   sender.peer_first[me + 1] - sender.peer_first[me], stream_);
    } else {
      const int64_t shift = sender.peer_row[me] - wire_before(!to_servers);
      e = kernels::copy_row_slices(offset(static_cast<std::byte*>(const_cast<void*>(s.src)), shift * s.src_stride),
                                   s.src_stride, s.dst, s.dst_stride, s.row_bytes,
                                   from_wire(receiver) + receiver.peer_first[me],
                                   receiver.peer_first[me + 1] - receiver.peer_first[me], stream_);
    }
    check_cuda(e, "this rank's own rows (copy kernel)");
  }

  // The table of one side of an exchange: the owners' (to their servers, or back to them) or the server's.
  static TableId table_of(RunSet set, bool owner_side) {
    const bool q = set == RunSet::Q;
    return owner_side ? (q ? OwnerQ : OwnerKv) : (q ? ServerQ : ServerKv);
  }
  const std::vector<int64_t>& wire_rows(RunSet set, bool owner_side) const {
    const bool q = set == RunSet::Q;
    return owner_side ? (q ? plan_.owner_q_rows : plan_.owner_kv_rows) : (q ? plan_.server_q_rows : plan_.server_kv_rows);
  }

  // The key/value owner's side of partial dK or dV in `recv` (wire order): the rows read by one server moved, the
  // rows read by several summed in fp32, peer after peer in rank order (bitwise reproducible), into `s.dst` with
  // rows `s.dst_stride` bytes apart.
  void sum_kv_rows(const std::byte* recv, const Slice& s) {
    const Table& single = plan_.tables[OwnerKvSingle];
    check_cuda(kernels::copy_row_slices(recv, s.row_bytes, s.dst, s.dst_stride, s.row_bytes, to_wire(single),
                                        single.count, stream_),
               "move dK/dV");
    const int64_t n = plan_.shared_kv_rows;
    const int64_t* index = static_cast<const int64_t*>(plan_.sum_index.ptr);
    const int64_t element = plan_.bf16 ? 2 : 4;
    check_cuda(kernels::sum_rows(recv, plan_.bf16, s.row_bytes / element, index + n, index + 2 * n + 1, index, n, s.dst,
                                 stream_, plan_.own_in_place, s.dst_stride / element),
               "sum dK/dV");
  }

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

  static std::byte* offset(std::byte* buffer, int64_t bytes) {
    return reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(buffer) + static_cast<uintptr_t>(bytes));
  }
  const RowCopy* to_wire(const Table& t) const { return static_cast<const RowCopy*>(plan_.to_wire.ptr) + t.offset; }
  const RowCopy* from_wire(const Table& t) const { return static_cast<const RowCopy*>(plan_.from_wire.ptr) + t.offset; }

  // The all_to_all_v of `t` on the communication stream after the caller's work so far; its end is rt_.done. A
  // staged exchange (host_staged) runs here, to its end on the caller's stream. `joined_later`: the caller joins
  // it after other work (Mover::start): its timing events are handed out there, caller_ready left to the join.
  void enqueue_transfer(const std::byte* send, const Transfer& t, std::byte* recv,
                        ExchangeEvents** joined_later = nullptr) {
    const size_t world = t.send_counts.size();
    const size_t me = static_cast<size_t>(ctx_.comm->rank());
    stats_.bytes_sent += t.send_bytes - t.send_counts[me];
    stats_.bytes_received += t.recv_bytes - t.recv_counts[me];
    if (ctx_.host_staged) {
      // Through pinned host memory, where the MPI communicator reads and writes: each peer's bytes are copied
      // from (to) where they lie on the device -- the same per-peer displacements NCCL would use -- into
      // (from) consecutive staging ranges.
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
      return;  // the staged exchange is synchronous: nothing runs beside it
    }
    // On the communication stream, joined to the caller's with events (and timed: stats.h ExchangeTimes).
    ExchangeEvents* timing = drain_ ? nullptr : begin_timing(rt_, ctx_.stats.gpu_exchange);
    check_cuda(cudaEventRecord(rt_.ready, stream_), "cudaEventRecord");
    if (timing != nullptr && joined_later != nullptr) {
      timing->joined = false;
      unjoined_.push_back(timing);
      *joined_later = timing;
    } else if (timing != nullptr) {
      check_cuda(cudaEventRecord(timing->caller_ready, stream_), "cudaEventRecord");
    }
    check_cuda(cudaStreamWaitEvent(rt_.comm_stream, rt_.ready, 0), "cudaStreamWaitEvent");
    if (timing != nullptr) check_cuda(cudaEventRecord(timing->comm_start, rt_.comm_stream), "cudaEventRecord");
    ctx_.comm->all_to_all_v(send, t, recv, rt_.comm_stream);
    check_cuda(cudaEventRecord(rt_.done, rt_.comm_stream), "cudaEventRecord");
    if (timing != nullptr) check_cuda(cudaEventRecord(timing->comm_end, rt_.comm_stream), "cudaEventRecord");
  }

  CadContext& ctx_;
  DevicePlan& plan_;
  CallScratch& scratch_;
  cudaStream_t stream_;
  bool drain_;
  CallStats& stats_;
  DeviceRuntime& rt_;
  std::vector<ExchangeEvents*> unjoined_;  // timed exchanges started here and not yet finished
};

void* data(const cad_tensor_v1_t* t) { return plugin::tensor_data(t); }

// The server batch's forward tensors in a call's scratch (a forward that keeps nothing, a backward re-sent).
void take_forward_tensors(CallScratch& scratch, const WorkspaceSizes& z, void** q, void** k, void** v, void** o,
                          void** lse) {
  *q = scratch.take(static_cast<size_t>(z.server_q), "the server batch (Q)");
  *k = scratch.take(static_cast<size_t>(z.server_kv), "the server batch (K)");
  *v = scratch.take(static_cast<size_t>(z.server_kv), "the server batch (V)");
  *o = scratch.take(static_cast<size_t>(z.server_q), "the server batch (O)");
  *lse = scratch.take(static_cast<size_t>(z.server_lse), "the server batch (LSE)");
}

// Called while a failure before any exchange is being handled: the peers wait for this rank's part of the
// call's exchanges, so run them drained (`drained`: the same call with drain=true, nothing computed), then
// report the first failure. Without it the peers waited for the communicator's timeout (a trainer on 4
// GPUs, 2026-11-26).
template <class Drained>
[[noreturn]] void drain_and_rethrow(Drained drained) {
  try {
    drained();
  } catch (const plugin::Failure&) {
    // The first failure is the one to report; a broken exchange shows on the peers too.
  }
  throw;
}

void copy_tensor(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "keeping the own tasks' tensors");
}

// Where head group g of a call's tensors lies (DevicePlan::head_groups): in an owner's [T, H, D] tensor a slice
// of each row; in the server batch group g's rows, whole ([G][rows][H/G][D]); in an LSE ([H, rows] on both
// sides) its heads. Each returns NULL for a NULL tensor (a drained call's).
struct HeadGroups {
  int64_t groups, q_bytes, kv_bytes, tokens, server_q_rows, server_kv_rows, heads;  // bytes: a full row's
  int64_t q_slice() const { return q_bytes / groups; }
  int64_t kv_slice() const { return kv_bytes / groups; }
  static std::byte* at(const void* base, int64_t bytes) {
    return base == nullptr ? nullptr : const_cast<std::byte*>(static_cast<const std::byte*>(base)) + bytes;
  }
  // Owner rows -> server batch group (`to_servers`) or back, for a Q-row or a KV-row tensor.
  Mover::Slice rows(RunSet set, int64_t g, const void* owner, void* server, bool to_servers) const {
    const bool q = set == RunSet::Q;
    const int64_t slice = q ? q_slice() : kv_slice(), full = q ? q_bytes : kv_bytes;
    std::byte* o = at(owner, g * slice);
    std::byte* s = at(server, g * slice * (q ? server_q_rows : server_kv_rows));
    return to_servers ? Mover::Slice{set, o, s, slice, full, slice} : Mover::Slice{set, s, o, slice, slice, full};
  }
  Mover::Slice lse(int64_t g, const float* owner, float* server, bool to_servers) const {
    const int64_t h = heads / groups;
    std::byte* o = at(owner, g * h * tokens * 4);
    std::byte* s = at(server, g * h * server_q_rows * 4);
    return to_servers ? Mover::Slice{RunSet::Q, o, s, h * 4, tokens, server_q_rows, true}
                      : Mover::Slice{RunSet::Q, s, o, h * 4, server_q_rows, tokens, true};
  }
  // The server batch's tensors of group g.
  ServerBatchTensors server(int64_t g, const ServerBatchTensors& all) const {
    ServerBatchTensors t;
    const int64_t q = g * q_slice() * server_q_rows, kv = g * kv_slice() * server_kv_rows;
    t.q = at(all.q, q), t.o = at(all.o, q), t.d_o = at(all.d_o, q), t.d_q = at(all.d_q, q);
    t.k = at(all.k, kv), t.v = at(all.v, kv), t.d_k = at(all.d_k, kv), t.d_v = at(all.d_v, kv);
    t.lse = reinterpret_cast<float*>(at(all.lse, g * (heads / groups) * server_q_rows * 4));
    return t;
  }
};

HeadGroups head_groups_of(const DevicePlan& dp, const CallShape& shape, const ServerBatch& batch) {
  return HeadGroups{dp.head_groups, shape.q_row_bytes(), shape.kv_row_bytes(), shape.tokens, batch.q_rows,
                    batch.kv_rows, shape.num_q_heads};
}

// The pipeline of a call by head groups (one group: the whole call): every group's inbound exchange started (in
// group order), the tasks run in place (`own`), then per group: join its inbound, `compute` it, start its outbound
// exchanges (`send_back`); `computed` runs after the last group's compute (what only the compute read can go), and
// the outbound exchanges are joined at the end. Each group's inbound slices come from `inbound`.
void pipeline_head_groups(Mover& move, int64_t groups, const std::function<std::vector<Mover::Slice>(int64_t)>& inbound,
                          const std::function<void()>& own, const std::function<void(int64_t)>& compute,
                          const std::function<void()>& computed,
                          const std::function<void(int64_t, std::vector<Mover::InFlight>&)>& send_back) {
  std::vector<Mover::InFlight> in, out;
  for (int64_t g = 0; g < groups; ++g) in.push_back(move.start(Direction::ToServers, inbound(g)));
  own();
  for (int64_t g = 0; g < groups; ++g) {
    move.finish(in[static_cast<size_t>(g)]);
    compute(g);
    if (g == groups - 1) computed();
    send_back(g, out);
  }
  for (Mover::InFlight& f : out) move.finish(f);
}

// A forward: Q/K/V in, O and LSE back, one collective per head group each way. `failed`: the backend whose call failed (`own`, the tasks run
// in place, sets it too); from the first failure on nothing more is computed or written to the caller's tensors,
// but every exchange still runs (the peers wait for them).
void forward_groups(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_forward_args_v1_t* args,
                       const ServerBatchTensors& server, Mover& move, bool drain, const std::function<void()>& own,
                       const std::function<void()>& computed, const ServerBackend*& failed) {
  const ServerBatch& batch = plan.step.layout.servers[static_cast<size_t>(ctx.comm->rank())];
  const HeadGroups hg = head_groups_of(*plan.device, shape, batch);
  const CallShape group_shape = head_group_shape(shape, plan.device->head_groups);
  using Args = cad_attention_forward_args_v1_t;
  const auto owner = [&](auto member) { return drain ? nullptr : data(args->*member); };
  pipeline_head_groups(
      move, hg.groups,
      [&](int64_t g) -> std::vector<Mover::Slice> {
        return {hg.rows(RunSet::Q, g, owner(&Args::q), server.q, true),
                hg.rows(RunSet::KV, g, owner(&Args::k), server.k, true),
                hg.rows(RunSet::KV, g, owner(&Args::v), server.v, true)};
      },
      own,
      [&](int64_t g) {
        if (failed == nullptr && batch.q_rows > 0 && !drain &&
            timed_server_forward(ctx, plan, Batch::Served, group_shape, hg.server(g, server),
                                cad_device_v1_t{CAD_DEVICE_CUDA, plan.device->device}, args->stream) != CAD_STATUS_OK) {
          failed = &ctx.server;
        }
      },
      computed,
      [&](int64_t g, std::vector<Mover::InFlight>& out) {
        if (failed != nullptr) move.stop_writing();
        out.push_back(move.start(Direction::ToOwners,
                                 {hg.rows(RunSet::Q, g, owner(&Args::o), server.o, false),
                                  hg.lse(g, static_cast<float*>(owner(&Args::lse)), server.lse, false)}));
      });
}

// A backward: dO (and Q, O, LSE, K, V where the forward kept nothing) in; dQ back, and dK and dV each with
// the moved / summed rule (Mover::sum_kv_rows). Failures as in the forward.
void backward_groups(CadContext& ctx, CadPlan& plan, const CallShape& shape,
                        const cad_attention_backward_args_v1_t* args, const ServerBatchTensors& server, bool kept,
                        Mover& move, bool drain, const std::function<void()>& own,
                        const std::function<void()>& computed, const ServerBackend*& failed) {
  const ServerBatch& batch = plan.step.layout.servers[static_cast<size_t>(ctx.comm->rank())];
  const HeadGroups hg = head_groups_of(*plan.device, shape, batch);
  const CallShape group_shape = head_group_shape(shape, plan.device->head_groups);
  using Args = cad_attention_backward_args_v1_t;
  const auto owner = [&](auto member) { return drain ? nullptr : data(args->*member); };
  pipeline_head_groups(
      move, hg.groups,
      [&](int64_t g) {
        std::vector<Mover::Slice> slices = {hg.rows(RunSet::Q, g, owner(&Args::d_o), server.d_o, true)};
        if (!kept) {
          slices.push_back(hg.rows(RunSet::Q, g, owner(&Args::q), server.q, true));
          slices.push_back(hg.rows(RunSet::Q, g, owner(&Args::o), server.o, true));
          slices.push_back(hg.lse(g, static_cast<const float*>(owner(&Args::lse)), server.lse, true));
          slices.push_back(hg.rows(RunSet::KV, g, owner(&Args::k), server.k, true));
          slices.push_back(hg.rows(RunSet::KV, g, owner(&Args::v), server.v, true));
        }
        return slices;
      },
      own,
      [&](int64_t g) {
        if (failed == nullptr && batch.q_rows > 0 && !drain &&
            timed_server_backward(ctx, plan, Batch::Served, group_shape, hg.server(g, server),
                                 cad_device_v1_t{CAD_DEVICE_CUDA, plan.device->device}, args->stream) != CAD_STATUS_OK) {
          failed = &ctx.server;
        }
      },
      computed,
      [&](int64_t g, std::vector<Mover::InFlight>& out) {
        if (failed != nullptr) move.stop_writing();
        out.push_back(move.start(Direction::ToOwners, {hg.rows(RunSet::Q, g, owner(&Args::d_q), server.d_q, false)}));
        for (auto [partial, grad] : {std::pair{server.d_k, &Args::d_k}, std::pair{server.d_v, &Args::d_v}}) {
          out.push_back(move.start(Direction::ToOwners, {hg.rows(RunSet::KV, g, owner(grad), partial, false)}, true));
        }
      });
}

}  // namespace

// A call on another stream than the plan's waits for the plan's uploads (on the GPU, not the host).
static void wait_for_tables(const DevicePlan& plan, cudaStream_t stream) {
  if (stream != static_cast<cudaStream_t>(plan.stream)) {
    check_cuda(cudaStreamWaitEvent(stream, plan.ready, 0), "waiting for the plan's tables");
  }
}

void device_forward(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_forward_args_v1_t* args,
                    Saved* keep, CallStats& stats, bool drain) {
  DevicePlan& dp = *plan.device;
  DeviceScope scope(dp.device);
  // A drained call may have no valid args at all.
  void* const call_stream = args != nullptr ? args->stream : nullptr;
  const cudaStream_t stream = static_cast<cudaStream_t>(call_stream);
  const int32_t me = ctx.comm->rank();
  const ServerBatch& batch = plan.step.layout.servers[static_cast<size_t>(me)];
  const ServerBatch& own = plan.step.layout.own[static_cast<size_t>(me)];
  const int64_t q_bytes = shape.q_row_bytes(), kv_bytes = shape.kv_row_bytes(), hq = shape.num_q_heads;
  wait_for_tables(dp, stream);
  const CallTimer timer(ctx, /*backward=*/false, stream, drain);
  CallScratch scratch(ctx, dp, call_stream);

  // The server batch: in the saved state (kept for backward) or in this call's scratch.
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr;
  if (!drain) {
    try {
      if (keep != nullptr) {
        keep->device.reset(new DeviceSaved);
        keep->device.get_deleter().ctx = &ctx;
        DeviceSaved& s = *keep->device;
        s.device = dp.device;
        s.stream = call_stream;
        s.q = allocate(ctx, dp.device, static_cast<size_t>(batch.q_rows * q_bytes), call_stream, "the kept server Q");
        s.k = allocate(ctx, dp.device, static_cast<size_t>(batch.kv_rows * kv_bytes), call_stream, "the kept server K");
        s.v = allocate(ctx, dp.device, static_cast<size_t>(batch.kv_rows * kv_bytes), call_stream, "the kept server V");
        s.o = allocate(ctx, dp.device, static_cast<size_t>(batch.q_rows * q_bytes), call_stream, "the kept server O");
        s.lse = allocate(ctx, dp.device, static_cast<size_t>(batch.q_rows * hq) * sizeof(float), call_stream,
                         "the kept server LSE");
        if (!own.segments.empty()) {
          const int64_t t = shape.tokens;
          s.own_q = allocate(ctx, dp.device, static_cast<size_t>(t * q_bytes), call_stream, "the kept own Q");
          s.own_k = allocate(ctx, dp.device, static_cast<size_t>(t * kv_bytes), call_stream, "the kept own K");
          s.own_v = allocate(ctx, dp.device, static_cast<size_t>(t * kv_bytes), call_stream, "the kept own V");
          s.own_o = allocate(ctx, dp.device, static_cast<size_t>(t * q_bytes), call_stream, "the kept own O");
          s.own_lse = allocate(ctx, dp.device, static_cast<size_t>(t * hq) * sizeof(float), call_stream,
                               "the kept own LSE");
        }
        q = s.q.ptr, k = s.k.ptr, v = s.v.ptr, o = s.o.ptr, lse = s.lse.ptr;
        stats.saved_bytes = total_bytes(s.buffers());
      } else {
        take_forward_tensors(scratch, dp.sizes, &q, &k, &v, &o, &lse);
      }
    } catch (const plugin::Failure&) {  // out of memory
      if (keep != nullptr) keep->device.reset();
      drain_and_rethrow([&] {
        CallStats ignored;
        device_forward(ctx, plan, shape, args, nullptr, ignored, /*drain=*/true);
      });
    }
  }
  // The tasks this rank runs in place, on the call's stream while the collective moves the other rows
  // (pipeline_head_groups). They write every row of the host's O and LSE (0 and -inf where they have none), before
  // the results coming back land.
  const ServerBackend* failed = nullptr;  // the backend whose call failed
  const auto own_forward = [&] {
    if (own.segments.empty() || drain) return;
    ServerBatchTensors t;
    t.q = data(args->q), t.k = data(args->k), t.v = data(args->v), t.o = data(args->o);
    t.lse = static_cast<float*>(data(args->lse));
    if (timed_server_forward(ctx, plan, Batch::Own, shape, t, cad_device_v1_t{CAD_DEVICE_CUDA, dp.device}, call_stream) !=
        CAD_STATUS_OK) {
      failed = &ctx.own_server;
    }
    if (failed == nullptr && keep != nullptr) {  // its backward may be handed stand-ins for q/k/v/o
      DeviceSaved& s = *keep->device;
      const size_t t_rows = static_cast<size_t>(shape.tokens);
      copy_tensor(s.own_q.ptr, t.q, t_rows * static_cast<size_t>(q_bytes), stream);
      copy_tensor(s.own_k.ptr, t.k, t_rows * static_cast<size_t>(kv_bytes), stream);
      copy_tensor(s.own_v.ptr, t.v, t_rows * static_cast<size_t>(kv_bytes), stream);
      copy_tensor(s.own_o.ptr, t.o, t_rows * static_cast<size_t>(q_bytes), stream);
      copy_tensor(s.own_lse.ptr, t.lse, t_rows * static_cast<size_t>(hq) * sizeof(float), stream);
    }
  };
  // The server batch's Q/K/V scratch is done once its forward ran: given back before O and LSE travel.
  const auto computed = [&] {
    if (keep != nullptr) return;
    scratch.give_back(q);
    scratch.give_back(k);
    scratch.give_back(v);
  };
  Mover move(ctx, dp, scratch, stream, drain, stats);
  ServerBatchTensors server;
  server.q = q, server.k = k, server.v = v, server.o = o, server.lse = static_cast<float*>(lse);
  forward_groups(ctx, plan, shape, args, server, move, drain, own_forward, computed, failed);
  stats.workspace_bytes = device_plan_bytes(dp) + scratch.peak_bytes();
  if (failed != nullptr) server_failed(*failed, CAD_STATUS_DEVICE_ERROR, "forward");
}

void device_backward(CadContext& ctx, CadPlan& plan, const CallShape& shape,
                     const cad_attention_backward_args_v1_t* args, Saved* saved, CallStats& stats, bool drain) {
  DevicePlan& dp = *plan.device;
  DeviceScope scope(dp.device);
  // A drained call may have no valid args at all.
  void* const call_stream = args != nullptr ? args->stream : nullptr;
  const cudaStream_t stream = static_cast<cudaStream_t>(call_stream);
  const int32_t me = ctx.comm->rank();
  const bool kept = saved != nullptr && saved->device != nullptr;
  const ServerBatch& own = plan.step.layout.own[static_cast<size_t>(me)];
  wait_for_tables(dp, stream);
  const CallTimer timer(ctx, /*backward=*/true, stream, drain);
  CallScratch scratch(ctx, dp, call_stream);

  // The server batch's gradients, and its forward tensors unless they were kept: this call's scratch.
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *lse = nullptr;
  void *d_o = nullptr, *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;
  if (!drain) {
    const WorkspaceSizes& z = dp.sizes;
    try {
      d_o = scratch.take(static_cast<size_t>(z.server_q), "the server batch (dO)");
      d_q = scratch.take(static_cast<size_t>(z.server_q), "the server batch (dQ)");
      d_k = scratch.take(static_cast<size_t>(z.server_kv), "the server batch (dK)");
      d_v = scratch.take(static_cast<size_t>(z.server_kv), "the server batch (dV)");
      if (!kept) take_forward_tensors(scratch, z, &q, &k, &v, &o, &lse);
    } catch (const plugin::Failure&) {  // out of memory
      drain_and_rethrow([&] {
        CallStats ignored;
        device_backward(ctx, plan, shape, args, nullptr, ignored, /*drain=*/true);
      });
    }
  }
  // The tasks this rank runs in place, on the call's stream while the collective moves the other rows (as in the
  // forward), from the owner's tensors or, where the forward kept state, from its copies of them (the host may
  // pass stand-ins for q/k/v/o then). They write every row of the host's dQ/dK/dV (0 where they read none): the
  // servers' dQ rows come back over them and their dK/dV rows are added (the plan's sum_every_row tables).
  const ServerBackend* failed = nullptr;  // the backend whose call failed
  const auto own_backward = [&] {
    if (own.segments.empty() || drain) return;
    ServerBatchTensors t;
    if (kept) {
      const DeviceSaved& s = *saved->device;
      t.q = s.own_q.ptr, t.k = s.own_k.ptr, t.v = s.own_v.ptr, t.o = s.own_o.ptr, t.lse = static_cast<float*>(s.own_lse.ptr);
    } else {
      t.q = data(args->q), t.k = data(args->k), t.v = data(args->v), t.o = data(args->o);
      t.lse = static_cast<float*>(data(args->lse));
    }
    t.d_o = data(args->d_o), t.d_q = data(args->d_q), t.d_k = data(args->d_k), t.d_v = data(args->d_v);
    if (timed_server_backward(ctx, plan, Batch::Own, shape, t, cad_device_v1_t{CAD_DEVICE_CUDA, dp.device},
                             call_stream) != CAD_STATUS_OK) {
      failed = &ctx.own_server;
    }
  };
  Mover move(ctx, dp, scratch, stream, drain, stats);
  if (kept) {
    DeviceSaved& s = *saved->device;
    q = s.q.ptr, k = s.k.ptr, v = s.v.ptr, o = s.o.ptr, lse = s.lse.ptr;
    s.stream = call_stream;  // released after this backward, in its stream order
  }
  // What the server backward read is no longer needed: dO and, where they were kept, the forward's tensors go
  // back before the gradients travel (the return exchanges' buffers then reuse that memory).
  const auto computed = [&] {
    scratch.give_back(d_o);
    if (kept) saved->device.reset();
  };
  ServerBatchTensors server;
  server.q = q, server.k = k, server.v = v, server.o = o, server.lse = static_cast<float*>(lse);
  server.d_o = d_o, server.d_q = d_q, server.d_k = d_k, server.d_v = d_v;
  backward_groups(ctx, plan, shape, args, server, kept, move, drain, own_backward, computed, failed);
  if (kept) saved->device.reset();
  stats.workspace_bytes = device_plan_bytes(dp) + scratch.peak_bytes();
  if (failed != nullptr) server_failed(*failed, CAD_STATUS_DEVICE_ERROR, "backward");
}

}  // namespace cad::cad_plugin
