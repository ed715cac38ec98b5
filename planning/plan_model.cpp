// plan_model.cpp -- see plan_model.h.
#include "plan_model.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "cad_plugin_v1.h"  // CAD_HAS_FIELD
#include "key_range.h"

namespace cad::plan {

ModelParams model_params(const cad_cost_params_v1_t& cost) {
  ModelParams p;
  p.num_q_heads = cost.num_q_heads;
  p.num_kv_heads = cost.num_kv_heads;
  p.head_dim = cost.head_dim;
  p.bytes_per_element = cost.bytes_per_element;
  p.causal = cost.causal != 0;
  // ABI v1.2, validated by the balancer (window.h): read only with CAD_WINDOW_GIVEN, else no window.
  if (CAD_HAS_FIELD(cad_cost_params_v1_t, &cost, window_right) && (cost.window_flags & CAD_WINDOW_GIVEN) != 0) {
    p.window_left = cost.window_left;
    p.window_right = p.causal ? -1 : cost.window_right;
  }
  return p;
}

int64_t task_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, bool causal) {
  const int64_t q = q_end - q_begin;
  if (q <= 0) return 0;
  if (!causal) return q * doc_len;
  // Query at position p sees p + 1 keys: sum over p in [q_begin, q_end) = q*q_end - q*(q-1)/2.
  return q * q_end - q * (q - 1) / 2;
}

namespace {

// sum of p over p in [a, b) (0 when b <= a).
int64_t sum_range(int64_t a, int64_t b) { return b <= a ? 0 : (a + b - 1) * (b - a) / 2; }
int64_t clamp(int64_t x, int64_t lo, int64_t hi) { return std::min(std::max(x, lo), hi); }

}  // namespace

int64_t task_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, const ModelParams& params) {
  if (!params.windowed()) return task_cost(q_begin, q_end, doc_len, params.causal);
  const int64_t q = q_end - q_begin;
  if (q <= 0) return 0;
  // Query p sees keys [lo(p), hi(p)], lo(p) = max(0, p - left), hi(p) = min(doc_len - 1, p + right): the
  // entries are the sum of hi(p) - lo(p) + 1, each sum in closed form around where the clamp starts.
  // A limit of doc_len or more hides no key of the document: clamping it there keeps every product below
  // doc_len^2 (window_right = INT64_MAX would wrap `right * ...` and `p + right`), and changes no sum.
  const int64_t right = params.causal ? 0 : (params.window_right < 0 ? doc_len : std::min(params.window_right, doc_len));
  const int64_t left = params.window_left < 0 ? -1 : std::min(params.window_left, doc_len);
  const int64_t hi_split = clamp(doc_len - right, q_begin, q_end);  // first p with p + right > doc_len - 1
  const int64_t sum_hi = sum_range(q_begin, hi_split) + right * (hi_split - q_begin) + (q_end - hi_split) * (doc_len - 1);
  int64_t sum_lo = 0;
  if (left >= 0) {
    const int64_t lo_split = clamp(left, q_begin, q_end);  // p - left >= 0 from here on
    sum_lo = sum_range(lo_split, q_end) - left * (q_end - lo_split);
  }
  return sum_hi - sum_lo + q;
}

KvRange task_kv_range(int64_t q_begin, int64_t q_end, int64_t doc_len, const ModelParams& params) {
  if (q_end <= q_begin) return {};
  // Both ends of a query's key range never decrease with its position (key_range.h): the task needs the
  // first query's begin to the last query's end.
  const int64_t right = params.causal ? -1 : params.window_right;
  const mask::KeyRange first = mask::visible_keys(q_begin, doc_len, params.causal, params.window_left, right);
  const mask::KeyRange last = mask::visible_keys(q_end - 1, doc_len, params.causal, params.window_left, right);
  return {first.begin, std::max(first.begin, last.end)};
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

std::vector<int64_t> colocated_cost(const RankPieces& ranks, const ModelParams& params) {
  std::vector<int64_t> cost(ranks.size(), 0);
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& p : ranks[r]) cost[r] += task_cost(p.offset_in_doc, p.offset_in_doc + p.len, p.doc_len, params);
  }
  return cost;
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
    KvRange kv;  // the hull of this server's tasks' KV ranges of the document
    size_t j = i;
    for (; j < order.size() && tasks[order[j]].server == server && tasks[order[j]].doc_id == first.doc_id; ++j) {
      const cad_task_v1_t& t = tasks[order[j]];
      st.cost[static_cast<size_t>(server)] += task_cost(t.q_begin, t.q_end, doc_len, params);
      kv = kv.hull(task_kv_range(t.q_begin, t.q_end, doc_len, params));
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
    // The KV range (a prefix without a window), once for this (server, doc), minus what the server holds.
    for (auto h = lo; h != hi; ++h) {
      const int64_t tokens = std::min(kv.end, h->offset + h->len) - std::max(kv.begin, h->offset);
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
