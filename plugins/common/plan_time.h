// plan_time.h -- predicted attention time of a plan from a measured kernel-rate table (rate_table.h):
// the time-based counterpart of plan_model.h's score entries. A task of q queries whose last query sees
// kv keys runs at the table's (q, kv) rate; a server's time is the sum over its tasks (forward +
// backward). The per-task rate ignores how the kernel fuses a server's tasks into one batch: a
// planning model, not a simulator.
#pragma once

#include <cstdint>
#include <vector>

#include "plan_model.h"
#include "rate_table.h"

namespace cad::plan {

// Score entries weighted by the time they take at their shape, in units of dense-rate entries:
// entries * table.relative_time(q, kv), rounded. Equal weighted costs = equal predicted time.
int64_t time_weighted_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, bool causal, const RateTable& table);

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
