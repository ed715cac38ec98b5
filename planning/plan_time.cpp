// plan_time.cpp -- see plan_time.h.
#include "plan_time.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

namespace cad::plan {

int64_t time_weighted_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, bool causal, const RateTable& table) {
  const int64_t entries = task_cost(q_begin, q_end, doc_len, causal);
  if (entries == 0) return 0;
  const int64_t kv = causal ? q_end : doc_len, q = q_end - q_begin;
  return std::llround(table.weighted_entries_at(entries, q, kv, causal, table.locate_q(q), table.locate_kv(kv)));
}

int64_t TimeCostMemo::compute(int64_t q_begin, int64_t q_end, int64_t doc_len) {
  const int64_t entries = task_cost(q_begin, q_end, doc_len, causal_);
  if (entries == 0) return 0;
  const int64_t kv = causal_ ? q_end : doc_len;
  if (kv != last_kv_) {
    last_kv_ = kv;
    last_kv_point_ = table_.locate_kv(kv);
  }
  const int64_t q = q_end - q_begin;
  return std::llround(table_.weighted_entries_at(entries, q, kv, causal_, table_.locate_q(q), last_kv_point_));
}

double task_seconds(int64_t q_begin, int64_t q_end, int64_t doc_len, const ModelParams& params,
                    const RateTable& table) {
  const int64_t entries = task_cost(q_begin, q_end, doc_len, params.causal);
  if (entries == 0) return 0;
  const int64_t kv = params.causal ? q_end : doc_len;
  return table.shard_seconds(q_end - q_begin, kv, params.causal, entries_to_flops(entries, params), params.num_q_heads);
}

std::vector<double> server_seconds(const RankPieces& ranks, int32_t num_servers, const cad_task_v1_t* tasks,
                                   int64_t num_tasks, const ModelParams& params, const RateTable& table) {
  std::map<int64_t, int64_t> doc_len;
  for (const auto& r : ranks)
    for (const auto& p : r) doc_len[p.doc_id] = p.doc_len;
  std::vector<double> seconds(static_cast<size_t>(std::max(num_servers, 0)), 0.0);
  for (int64_t i = 0; i < num_tasks; ++i) {
    const cad_task_v1_t& t = tasks[i];
    const auto it = doc_len.find(t.doc_id);
    if (it == doc_len.end()) {
      throw std::invalid_argument("plan names document " + std::to_string(t.doc_id) + ", which no rank holds");
    }
    if (t.server < 0 || t.server >= num_servers) {
      throw std::invalid_argument("task of document " + std::to_string(t.doc_id) + " names server " +
                                  std::to_string(t.server) + " outside [0, " + std::to_string(num_servers) + ")");
    }
    seconds[static_cast<size_t>(t.server)] += task_seconds(t.q_begin, t.q_end, it->second, params, table);
  }
  return seconds;
}

double imbalance_of(const std::vector<double>& values) {
  if (values.empty()) return 1.0;
  const double mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  if (mean <= 0) return 1.0;
  return *std::max_element(values.begin(), values.end()) / mean;
}

}  // namespace cad::plan
