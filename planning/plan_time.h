// plan_time.h -- predicted attention time of a plan from a measured kernel-rate table (rate_table.h):
// the time-based counterpart of plan_model.h's score entries. A task of q queries whose last query sees
// kv keys runs at the table's (q, kv) rate -- its backward, when the table has "backward_tiles", at the
// tile-pair formula instead (rate_table.h, tile_pairs.h); a server's time is the sum over its tasks
// (forward + backward). The per-task rate ignores how the kernel fuses a server's tasks into one batch: a
// planning model, not a simulator.
#pragma once

#include <cstdint>
#include <vector>

#include "plan_model.h"
#include "rate_table.h"

namespace cad::plan {

// Score entries weighted by the time they take at their shape, in units of dense-rate entries:
// entries * table.relative_time(q, kv), rounded (RateTable::weighted_entries_at, which with
// "backward_tiles" prices the backward by the task's tile pairs). Equal weighted costs = equal
// predicted time.
int64_t time_weighted_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, bool causal, const RateTable& table);

// time_weighted_cost with a memo, for a balancer that asks for the same shard's cost many times in one
// plan call (binary searches over shard starts and ends repeat their first probes across receivers and
// steps: about 5 of 6 lookups at 512 servers). A direct-mapped cache: a slot keeps the last (range,
// doc_len) hashed to it, so a hit returns exactly what time_weighted_cost returned and a collision only
// recomputes. Not thread-safe (one per plan call); capacity is fixed (~1 MiB).
class TimeCostMemo {
 public:
  TimeCostMemo(const RateTable& table, bool causal) : table_(table), causal_(causal), slots_(kSlots) {}

  int64_t cost(int64_t q_begin, int64_t q_end, int64_t doc_len) {
    if (q_begin >= q_end) return 0;
    // A causal shard's cost does not depend on doc_len (its rate and its tile pairs are functions of
    // q = q_end - q_begin and kv = q_end): equal ranges of other documents hit.
    if (causal_) doc_len = 0;
    Slot& s = slots_[slot_of(q_begin, q_end, doc_len)];
    if (s.q_begin != q_begin || s.q_end != q_end || s.doc_len != doc_len) {
      s = {q_begin, q_end, doc_len, compute(q_begin, q_end, doc_len)};
    }
    return s.cost;
  }

 private:
  // time_weighted_cost, bit for bit, reusing the KV axis lookup of the previous call when its KV
  // length is the same (a search over shard starts keeps the end, so the KV length, fixed).
  int64_t compute(int64_t q_begin, int64_t q_end, int64_t doc_len);
  static constexpr size_t kSlotBits = 12;
  static constexpr size_t kSlots = size_t{1} << kSlotBits;
  struct Slot {
    int64_t q_begin = -1, q_end = -1, doc_len = -1;  // -1: empty (no real range matches it)
    int64_t cost = 0;
  };
  // Multiplicative hash of the three values; the top bits pick the slot.
  static size_t slot_of(int64_t q_begin, int64_t q_end, int64_t doc_len) {
    uint64_t h = static_cast<uint64_t>(q_begin) * 0x9E3779B97F4A7C15ull;
    h ^= static_cast<uint64_t>(q_end) * 0xC2B2AE3D27D4EB4Full;
    h ^= static_cast<uint64_t>(doc_len) * 0x165667B19E3779F9ull;
    return static_cast<size_t>(h >> (64 - kSlotBits));
  }
  const RateTable& table_;
  const bool causal_;
  std::vector<Slot> slots_;
  int64_t last_kv_ = -1;               // KV length of the last computed cost
  RateTable::AxisPoint last_kv_point_;  // and where it falls on the table's KV axis
};

// Predicted forward + backward seconds of one task.
double task_seconds(int64_t q_begin, int64_t q_end, int64_t doc_len, const ModelParams& params,
                    const RateTable& table);

// Predicted seconds per server of a plan's tasks. Throws std::invalid_argument for a task naming a
// document no rank holds or a server outside [0, num_servers).
std::vector<double> server_seconds(const RankPieces& ranks, int32_t num_servers, const cad_task_v1_t* tasks,
                                   int64_t num_tasks, const ModelParams& params, const RateTable& table);

// max / mean of a vector (1 when all are 0).
double imbalance_of(const std::vector<double>& values);

}  // namespace cad::plan
