// device_path.cpp -- see device_path.h. Built only with CUDA (device_path_none.cpp otherwise): the CUDA forward and
// backward. Their parts live by concern: device memory (device_memory.h), the plan's tables (device_plan.h), the
// exchange engine (mover.h) and its wires (wire_device.h), the order of the parts (schedule.h), timing
// (gpu_timing.h), the instance's stream and events (device_runtime.h).
#include "device_path.h"

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "cuda_check.h"
#include "data_path.h"
#include "device_memory.h"
#include "device_plan.h"
#include "device_runtime.h"
#include "gpu_timing.h"
#include "mover.h"
#include "schedule.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

namespace {

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
  CallScratch scratch(ctx, dp.device, call_stream);

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
  CallScratch scratch(ctx, dp.device, call_stream);

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
