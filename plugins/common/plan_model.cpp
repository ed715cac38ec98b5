// plan_model.cpp -- see plan_model.h.
#include "plan_model.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace cad::plan {

ModelParams model_params(const cad_cost_params_v1_t& cost) {
  ModelParams p;
  p.num_q_heads = cost.num_q_heads;
  p.num_kv_heads = cost.num_kv_heads;
  p.head_dim = cost.head_dim;
  p.bytes_per_element = cost.bytes_per_element;
  p.causal = cost.causal != 0;
  return p;
}

int64_t task_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, bool causal) {
  const int64_t q = q_end - q_begin;
  if (q <= 0) return 0;
  if (!causal) return q * doc_len;
  // Query at position p sees p + 1 keys: sum over p in [q_begin, q_end) = q*q_end - q*(q-1)/2.
  return q * q_end - q * (q - 1) / 2;
}

double entries_to_flops(int64_t entries, const ModelParams& params) {
  return 4.0 * params.head_dim * params.num_q_heads * static_cast<double>(entries);
}

namespace {

// Who holds which tokens of one document.
struct Holding {
  int64_t doc_id;
  int64_t doc_len;
  int64_t offset;
  int64_t len;
  int32_t rank;
};

// Holdings sorted by (doc_id, offset): the holders of a document are one contiguous run.
std::vector<Holding> sorted_holdings(const RankPieces& ranks) {
  std::vector<Holding> h;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& p : ranks[r]) h.push_back({p.doc_id, p.doc_len, p.offset_in_doc, p.len, static_cast<int32_t>(r)});
  }
  std::sort(h.begin(), h.end(), [](const Holding& a, const Holding& b) {
    return a.doc_id != b.doc_id ? a.doc_id < b.doc_id : a.offset < b.offset;
  });
  return h;
}

double mean_of(const std::vector<int64_t>& v) {
  if (v.empty()) return 0;
  return static_cast<double>(std::accumulate(v.begin(), v.end(), int64_t{0})) / static_cast<double>(v.size());
}

}  // namespace

double imbalance_of(const std::vector<int64_t>& cost) {
  const double mean = mean_of(cost);
  if (mean <= 0) return 1.0;
  return static_cast<double>(*std::max_element(cost.begin(), cost.end())) / mean;
}

std::vector<int64_t> colocated_cost(const RankPieces& ranks, bool causal) {
  std::vector<int64_t> cost(ranks.size(), 0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& p : ranks[r]) cost[r] += task_cost(p.offset_in_doc, p.offset_in_doc + p.len, p.doc_len, causal);
  }
  return cost;
}

PlanStats evaluate_plan(const RankPieces& ranks, int32_t num_servers, const cad_task_v1_t* tasks,
                        int64_t num_tasks, const ModelParams& params) {
  PlanStats st;
  st.num_servers = num_servers;
  st.num_ranks = static_cast<int32_t>(ranks.size());
  st.num_nodes = std::max(st.num_ranks, num_servers);
  const size_t n = static_cast<size_t>(st.num_nodes);
  st.cost.assign(static_cast<size_t>(num_servers), 0);
  st.flops.assign(static_cast<size_t>(num_servers), 0.0);
  st.memory_received.assign(static_cast<size_t>(num_servers), 0);
  st.bytes_sent.assign(n, 0);
  st.bytes_received.assign(n, 0);
  st.link_bytes.assign(n * n, 0);

  const std::vector<Holding> holdings = sorted_holdings(ranks);
  auto holders_of = [&](int64_t doc_id) {
    auto lo = std::lower_bound(holdings.begin(), holdings.end(), doc_id,
                               [](const Holding& h, int64_t id) { return h.doc_id < id; });
    auto hi = lo;
    while (hi != holdings.end() && hi->doc_id == doc_id) ++hi;
    if (lo == hi) throw std::invalid_argument("plan names document " + std::to_string(doc_id) + ", which no rank holds");
    return std::make_pair(lo, hi);
  };
  auto move = [&](int32_t src, int32_t dst, int64_t bytes) {
    st.link_bytes[static_cast<size_t>(src) * n + static_cast<size_t>(dst)] += bytes;
  };

  // Visit tasks grouped by (server, doc) so that each KV prefix is counted once per server.
  std::vector<int64_t> order(static_cast<size_t>(num_tasks));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const auto& x = tasks[a];
    const auto& y = tasks[b];
    if (x.server != y.server) return x.server < y.server;
    if (x.doc_id != y.doc_id) return x.doc_id < y.doc_id;
    return x.q_begin < y.q_begin;
  });

  for (size_t i = 0; i < order.size();) {
    const cad_task_v1_t& first = tasks[order[i]];
    const int32_t server = first.server;
    if (server < 0 || server >= num_servers) {
      throw std::invalid_argument("task of document " + std::to_string(first.doc_id) + " names server " +
                                  std::to_string(server) + " outside [0, " + std::to_string(num_servers) + ")");
    }
    const auto [lo, hi] = holders_of(first.doc_id);
    const int64_t doc_len = lo->doc_len;
    int64_t kv_end = 0;
    size_t j = i;
    for (; j < order.size() && tasks[order[j]].server == server && tasks[order[j]].doc_id == first.doc_id; ++j) {
      const cad_task_v1_t& t = tasks[order[j]];
      st.cost[static_cast<size_t>(server)] += task_cost(t.q_begin, t.q_end, doc_len, params.causal);
      kv_end = std::max(kv_end, task_kv_end(t.q_begin, t.q_end, doc_len, params.causal));
      // Q rows held elsewhere: out as Q, back as O + LSE.
      for (auto h = lo; h != hi; ++h) {
        const int64_t rows = std::min(t.q_end, h->offset + h->len) - std::max(t.q_begin, h->offset);
        if (rows <= 0 || h->rank == server) continue;
        st.q_rows_moved += rows;
        move(h->rank, server, rows * params.q_row_bytes());
        move(server, h->rank, rows * (params.o_row_bytes() + params.lse_row_bytes()));
        st.memory_received[static_cast<size_t>(server)] += rows * params.q_memory_bytes();
      }
    }
    // The KV prefix [0, kv_end), once for this (server, doc), minus what the server holds.
    for (auto h = lo; h != hi; ++h) {
      const int64_t tokens = std::min(kv_end, h->offset + h->len) - h->offset;
      if (tokens <= 0 || h->rank == server) continue;
      st.kv_tokens_moved += tokens;
      move(h->rank, server, tokens * params.kv_token_bytes());
      st.memory_received[static_cast<size_t>(server)] += tokens * params.kv_token_bytes();
    }
    i = j;
  }

  for (size_t s = 0; s < n; ++s) {
    for (size_t d = 0; d < n; ++d) {
      const int64_t b = st.link_bytes[s * n + d];
      st.bytes_sent[s] += b;
      st.bytes_received[d] += b;
      st.total_bytes += b;
    }
  }
  for (int32_t s = 0; s < num_servers; ++s) {
    st.flops[static_cast<size_t>(s)] = entries_to_flops(st.cost[static_cast<size_t>(s)], params);
    st.total_cost += st.cost[static_cast<size_t>(s)];
  }
  st.mean_cost = mean_of(st.cost);
  st.max_cost = st.cost.empty() ? 0.0 : static_cast<double>(*std::max_element(st.cost.begin(), st.cost.end()));
  st.imbalance = imbalance_of(st.cost);
  return st;
}

}  // namespace cad::plan
