// step_model.cpp -- per-rank times and the step's composition (see step_model.h).
#include "step_model.h"

#include <algorithm>
#include <stdexcept>

namespace cad::simulate {

AttentionSeconds attention_seconds(const std::vector<Shard>& shards, int64_t heads_per_gpu, int64_t head_dim,
                                   const AttentionRates& rates) {
  AttentionSeconds out;
  const double flops_per_entry = 4.0 * static_cast<double>(head_dim) * static_cast<double>(heads_per_gpu);
  for (const Shard& s : shards) {
    if (s.entries == 0) continue;
    const double fwd = flops_per_entry * static_cast<double>(s.entries);
    out.fwd_flops += fwd;
    out.fwd += fwd / (rates.fwd_tflops(s.q, s.kv) * 1e12);
    out.bwd += rates.bwd_seconds(s.q, s.kv, s.causal, fwd, heads_per_gpu);
  }
  return out;
}

RankTime rank_time(const RankWork& work, const ModelShape& shape, const Layout& layout,
                   const SystemCalibration& cal, bool pingpong) {
  const double tokens = static_cast<double>(work.tokens);
  const double tp = static_cast<double>(layout.tp);
  const double layers = static_cast<double>(shape.layers / layout.pp);

  // Per layer, forward.
  const double gemm = tokens * shape.linear_flops_per_token_layer() / tp / (cal.gemm_tflops * 1e12);
  const double elementwise = tokens * static_cast<double>(shape.hidden) *
                             cal.elementwise_bytes_per_token_layer_per_hidden / tp / (cal.hbm_GBps * 1e9);
  const double linear_fwd = gemm + elementwise;
  const double linear_bwd = 2 * linear_fwd;
  const double comm = all_to_all_seconds(cal, work.bytes);
  double tp_comm = 0;
  if (layout.tp > 1) {
    const double activation_bytes = tokens * static_cast<double>(shape.hidden) * 2;  // bf16
    tp_comm = 4 * intra_node_seconds(cal, activation_bytes * (tp - 1) / tp);
  }
  // Ping-pong hides cal.overlap of the exchange, at most the pass's compute (comm_model.h).
  auto pass = [&](double compute) { return pingpong ? overlapped_seconds(compute, comm, cal.overlap) : compute + comm; };
  const double fwd = pass(linear_fwd + work.attention.fwd);
  const double bwd = pass(linear_bwd + work.attention.bwd);

  RankTime t;
  const double head = 3 * tokens * shape.head_flops_per_token() / tp / (cal.gemm_tflops * 1e12);
  t.linear = layers * (linear_fwd + linear_bwd) + head;
  t.attention = layers * (work.attention.fwd + work.attention.bwd);
  t.comm = layers * 2 * comm;
  t.tp_comm = layers * 2 * tp_comm;
  t.total = layers * (fwd + bwd + 2 * tp_comm) + head;
  // What ping-pong could not hide (all of it without ping-pong); clamped against rounding.
  t.comm_exposed = std::max(0.0, t.total - t.linear - t.attention - t.tp_comm);
  return t;
}

double step_seconds(const std::vector<std::vector<double>>& times, int64_t group_size, int64_t pp) {
  if (times.empty()) throw std::invalid_argument("step_seconds: no micro-batches");
  if (group_size < 1) throw std::invalid_argument("step_seconds: group size must be >= 1");
  const size_t ranks = times.front().size();
  for (const auto& m : times) {
    if (m.size() != ranks) throw std::invalid_argument("step_seconds: micro-batches with different rank counts");
  }
  double step = 0;
  for (size_t begin = 0; begin < ranks; begin += static_cast<size_t>(group_size)) {
    const size_t end = std::min(ranks, begin + static_cast<size_t>(group_size));
    double sum = 0, slowest = 0;
    for (const auto& m : times) {
      const double t = *std::max_element(m.begin() + static_cast<std::ptrdiff_t>(begin),
                                         m.begin() + static_cast<std::ptrdiff_t>(end));
      sum += t;
      slowest = std::max(slowest, t);
    }
    step = std::max(step, sum + static_cast<double>(pp - 1) * slowest);
  }
  return step;
}

}  // namespace cad::simulate
