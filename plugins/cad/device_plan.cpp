// device_plan.cpp -- see device_plan.h.
#include "device_plan.h"

#include <memory>

#include "cuda_check.h"
#include "device_path.h"
#include "device_runtime.h"
#include "pack.h"

namespace cad::cad_plugin {

using kernels::RowCopy;

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

void wait_for_tables(const DevicePlan& plan, cudaStream_t stream) {
  if (stream != static_cast<cudaStream_t>(plan.stream)) {
    check_cuda(cudaStreamWaitEvent(stream, plan.ready, 0), "waiting for the plan's tables");
  }
}

}  // namespace cad::cad_plugin
