// plan_work.cpp -- batch + plan -> per-rank work (see plan_work.h).
#include "plan_work.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace cad::simulate {

cad::plan::RankPieces documents_per_rank(const cad::plan::RankPieces& batch) {
  cad::plan::RankPieces out = batch;
  int64_t next_id = 0;
  for (auto& rank : out) {
    for (auto& p : rank) {
      p.doc_id = next_id++;
      p.doc_len = p.len;
      p.offset_in_doc = 0;
    }
  }
  return out;
}

cad::plan::RankPieces documents_within_groups(const cad::plan::RankPieces& batch, int64_t unit,
                                              int64_t* cut_documents) {
  const auto ranks = static_cast<int64_t>(batch.size());
  if (unit < 1 || ranks % unit != 0) {
    throw std::invalid_argument("documents_within_groups: " + std::to_string(ranks) +
                                " ranks are not whole groups of " + std::to_string(unit));
  }
  cad::plan::RankPieces out;
  out.reserve(batch.size());
  std::map<int64_t, int64_t> groups_of;  // original document -> groups it lies in
  int64_t next_id = 0;
  for (int64_t begin = 0; begin < ranks; begin += unit) {
    cad::plan::RankPieces group = group_pieces(batch, begin, begin + unit);
    std::map<int64_t, int64_t> id;  // original id -> new id, in this group
    for (auto& rank : group) {
      for (auto& p : rank) {
        auto it = id.find(p.doc_id);
        if (it == id.end()) {
          ++groups_of[p.doc_id];
          it = id.emplace(p.doc_id, next_id++).first;
        }
        p.doc_id = it->second;
      }
      out.push_back(std::move(rank));
    }
  }
  if (cut_documents != nullptr) {
    *cut_documents = 0;
    for (const auto& [doc, groups] : groups_of) *cut_documents += groups > 1 ? 1 : 0;
  }
  return out;
}

cad::plan::RankPieces group_pieces(const cad::plan::RankPieces& all, int64_t begin, int64_t end) {
  cad::plan::RankPieces group(all.begin() + begin, all.begin() + end);
  // The token range [lo, hi) of each document inside the group; pieces of one document are contiguous.
  std::map<int64_t, std::pair<int64_t, int64_t>> range;
  for (const auto& rank : group) {
    for (const auto& p : rank) {
      auto it = range.find(p.doc_id);
      if (it == range.end()) {
        range[p.doc_id] = {p.offset_in_doc, p.offset_in_doc + p.len};
      } else {
        it->second.first = std::min(it->second.first, p.offset_in_doc);
        it->second.second = std::max(it->second.second, p.offset_in_doc + p.len);
      }
    }
  }
  for (auto& rank : group) {
    for (auto& p : rank) {
      const auto& [lo, hi] = range.at(p.doc_id);
      p.offset_in_doc -= lo;
      p.doc_len = hi - lo;
    }
  }
  return group;
}

cad::plan::RankPieces context_parallel_layout(const cad::plan::RankPieces& pieces,
                                              const std::vector<cad_task_v1_t>& tasks, int32_t servers) {
  std::map<int64_t, int64_t> doc_len;
  for (const auto& rank : pieces)
    for (const auto& p : rank) doc_len[p.doc_id] = p.doc_len;
  cad::plan::RankPieces layout(static_cast<size_t>(servers));
  for (const auto& t : tasks) {
    if (t.server < 0 || t.server >= servers) throw std::invalid_argument("context_parallel_layout: task server out of range");
    cad_piece_v1_t p{};
    p.doc_id = t.doc_id;
    p.doc_len = doc_len.at(t.doc_id);
    p.offset_in_doc = t.q_begin;
    p.len = t.q_end - t.q_begin;
    layout[static_cast<size_t>(t.server)].push_back(p);
  }
  return layout;
}

void route_by_rail(const std::vector<int64_t>& link_bytes, size_t stride, const Layout& layout, int64_t first_rank,
                   std::vector<RankWork>& work) {
  const size_t n = std::min(stride, work.size());
  // Rebuilt from the link matrix: each rank's NIC sends what its node sends to ranks of its rail elsewhere;
  // what a rank sends to another rail first crosses NVLink to the rail's GPU in its node (the relay).
  std::vector<double> nic_sent(n, 0), relay_out(n, 0), relay_in(n, 0);
  auto rank = [&](size_t i) { return first_rank + static_cast<int64_t>(i); };
  std::map<std::pair<int64_t, int64_t>, size_t> by_node_rail;  // (node, rail) -> the group's rank there
  for (size_t i = 0; i < n; ++i) by_node_rail[{layout.node_of(rank(i)), layout.rail_of(rank(i))}] = i;
  for (size_t a = 0; a < n; ++a) {
    const int64_t node = layout.node_of(rank(a));
    for (size_t b = 0; b < n; ++b) {
      if (a == b || layout.node_of(rank(b)) == node) continue;
      const auto bytes = static_cast<double>(link_bytes[a * stride + b]);
      if (bytes == 0) continue;
      const auto it = by_node_rail.find({node, layout.rail_of(rank(b))});
      // A rail of the node outside this group (a group smaller than the node) has no GPU to relay: own NIC.
      const size_t relay = it == by_node_rail.end() ? a : it->second;
      nic_sent[relay] += bytes;
      if (relay != a) {
        relay_out[a] += bytes;
        relay_in[relay] += bytes;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    RankBytes& b = work[i].bytes;
    b.sent_inter = nic_sent[i];
    b.sent_intra += relay_out[i];
    b.received_intra += relay_in[i];
  }
}

std::vector<RankWork> rank_work(const cad::plan::RankPieces& pieces, const std::vector<cad_task_v1_t>& tasks,
                                const cad::plan::ModelParams& params, const Layout& layout, int64_t first_rank,
                                const AttentionRates& rates, double* total_bytes) {
  const auto n = static_cast<int32_t>(pieces.size());
  const cad::plan::PlanStats stats =
      cad::plan::evaluate_plan(pieces, n, tasks.data(), static_cast<int64_t>(tasks.size()), params);
  std::map<int64_t, int64_t> doc_len;
  for (const auto& rank : pieces)
    for (const auto& p : rank) doc_len[p.doc_id] = p.doc_len;

  std::vector<RankWork> work(static_cast<size_t>(n));
  for (int32_t r = 0; r < n; ++r) {
    for (const auto& p : pieces[static_cast<size_t>(r)]) work[static_cast<size_t>(r)].tokens += p.len;
  }
  std::vector<std::vector<Shard>> shards(static_cast<size_t>(n));
  for (const auto& t : tasks) {
    const int64_t len = doc_len.at(t.doc_id);
    Shard s;
    s.q = t.q_end - t.q_begin;
    s.kv = params.causal ? t.q_end : len;
    s.entries = cad::plan::task_cost(t.q_begin, t.q_end, len, params.causal);
    s.causal = params.causal;
    shards[static_cast<size_t>(t.server)].push_back(s);
  }
  const size_t nodes = static_cast<size_t>(stats.num_nodes);
  for (int32_t r = 0; r < n; ++r) {
    RankWork& w = work[static_cast<size_t>(r)];
    w.attention = attention_seconds(shards[static_cast<size_t>(r)], params.num_q_heads, params.head_dim, rates);
    const int64_t node = layout.node_of(first_rank + r);
    for (size_t peer = 0; peer < nodes; ++peer) {
      if (peer == static_cast<size_t>(r)) continue;
      const bool same_node = layout.node_of(first_rank + static_cast<int64_t>(peer)) == node;
      const auto out = static_cast<double>(stats.link_bytes[static_cast<size_t>(r) * nodes + peer]);
      const auto in = static_cast<double>(stats.link_bytes[peer * nodes + static_cast<size_t>(r)]);
      (same_node ? w.bytes.sent_intra : w.bytes.sent_inter) += out;
      (same_node ? w.bytes.received_intra : w.bytes.received_inter) += in;
    }
  }
  if (layout.rail_routed) route_by_rail(stats.link_bytes, nodes, layout, first_rank, work);
  if (total_bytes != nullptr) *total_bytes = static_cast<double>(stats.total_bytes);
  return work;
}

}  // namespace cad::simulate
