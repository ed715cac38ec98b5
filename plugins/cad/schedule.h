// schedule.h -- the order in which one call of the CUDA data path runs its parts (CUDA builds only): the head
// groups (Config::head_groups) and the tasks a rank runs in place (Config::own_tasks_in_place, layout.h's
// Layout::own). Every group's inbound exchange is started at once, in group order; then the tasks run in place, on
// the owner's own tensors while those rows are in flight; then per group: join its inbound exchange, compute it on
// the server, start its outbound exchanges, and go on with the next group while they travel; the outbound
// exchanges are joined at the end. One group is the whole call. The CPU path runs the same parts in the same order
// without the overlap (cpu_path.cpp): inbound exchange, tasks in place, the server batch, outbound exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "data_path.h"
#include "device_plan.h"
#include "mover.h"

namespace cad::cad_plugin {

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

inline HeadGroups head_groups_of(const DevicePlan& dp, const CallShape& shape, const ServerBatch& batch) {
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
                          const std::function<void(int64_t, std::vector<Mover::InFlight>&)>& send_back);

}  // namespace cad::cad_plugin
