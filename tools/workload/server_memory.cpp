// server_memory.cpp -- see server_memory.h.
#include "server_memory.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

namespace cad::workload {

namespace {

struct Held {
  int32_t rank;
  int64_t offset;
  int64_t len;
};
using Holders = std::unordered_map<int64_t, std::vector<Held>>;  // doc -> its pieces

Holders holders_of(const cad::plan::RankPieces& ranks) {
  Holders out;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& p : ranks[r]) out[p.doc_id].push_back({static_cast<int32_t>(r), p.offset_in_doc, p.len});
  }
  return out;
}

// Tokens of [begin, end) of the document that `rank` holds.
int64_t held_by(const std::vector<Held>& pieces, int32_t rank, int64_t begin, int64_t end) {
  int64_t n = 0;
  for (const auto& h : pieces) {
    if (h.rank == rank) n += std::max<int64_t>(0, std::min(end, h.offset + h.len) - std::max(begin, h.offset));
  }
  return n;
}

}  // namespace

ServerMemory server_memory(const cad::plan::RankPieces& ranks, int32_t num_servers, const cad_task_v1_t* tasks,
                           int64_t num_tasks, const cad::plan::ModelParams& params) {
  const Holders holders = holders_of(ranks);
  ServerMemory m;
  const size_t n = static_cast<size_t>(num_servers);
  m.kv_rows.assign(n, 0);
  m.kv_bytes.assign(n, 0);
  m.foreign_bytes.assign(n, 0);
  m.largest.assign(n, DocMemory{});
  // Tasks grouped by (server, document): one K/V copy per group.
  std::vector<int64_t> order(static_cast<size_t>(num_tasks));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    if (tasks[a].server != tasks[b].server) return tasks[a].server < tasks[b].server;
    return tasks[a].doc_id < tasks[b].doc_id;
  });
  for (size_t i = 0; i < order.size();) {
    const cad_task_v1_t& first = tasks[order[i]];
    const int32_t s = first.server;
    if (s < 0 || s >= num_servers) {
      throw std::invalid_argument("task of document " + std::to_string(first.doc_id) + " names server " +
                                  std::to_string(s) + " outside [0, " + std::to_string(num_servers) + ")");
    }
    const auto found = holders.find(first.doc_id);
    if (found == holders.end()) {
      throw std::invalid_argument("plan names document " + std::to_string(first.doc_id) + ", which no rank holds");
    }
    const std::vector<Held>& pieces = found->second;
    int64_t doc_len = 0;
    for (const auto& h : pieces) doc_len = std::max(doc_len, h.offset + h.len);
    DocMemory d;
    d.doc_id = first.doc_id;
    cad::plan::KvRange kv;
    size_t j = i;
    for (; j < order.size() && tasks[order[j]].server == s && tasks[order[j]].doc_id == first.doc_id; ++j) {
      const cad_task_v1_t& t = tasks[order[j]];
      if (t.q_end <= t.q_begin) continue;
      kv = kv.hull(cad::plan::task_kv_range(t.q_begin, t.q_end, doc_len, params));
      d.foreign_q_rows += (t.q_end - t.q_begin) - held_by(pieces, s, t.q_begin, t.q_end);
    }
    if (!kv.empty()) {
      d.kv_rows = kv.end - kv.begin;
      d.foreign_kv_rows = d.kv_rows - held_by(pieces, s, kv.begin, kv.end);
    }
    d.foreign_bytes = d.foreign_kv_rows * params.kv_token_bytes() + d.foreign_q_rows * params.q_memory_bytes();
    const size_t k = static_cast<size_t>(s);
    m.kv_rows[k] += d.kv_rows;
    m.kv_bytes[k] += d.kv_rows * params.kv_token_bytes();
    m.foreign_bytes[k] += d.foreign_bytes;
    if (m.largest[k].doc_id < 0 || d.foreign_bytes > m.largest[k].foreign_bytes) m.largest[k] = d;
    i = j;
  }
  return m;
}

MemoryFloor largest_memory_floor(const cad::plan::RankPieces& ranks, const cad::plan::ModelParams& params) {
  const Holders holders = holders_of(ranks);
  MemoryFloor worst;
  for (const auto& [doc, pieces] : holders) {
    int64_t doc_len = 0;
    for (const auto& h : pieces) doc_len = std::max(doc_len, h.offset + h.len);
    MemoryFloor f;
    f.doc_id = doc;
    f.doc_len = doc_len;
    f.keys = cad::plan::task_kv_range(doc_len - 1, doc_len, doc_len, params);
    for (const auto& h : pieces) {  // only a rank holding part of it can receive less than the whole
      const int64_t held = held_by(pieces, h.rank, f.keys.begin, f.keys.end);
      const int64_t q_held = held_by(pieces, h.rank, doc_len - 1, doc_len);
      const int64_t bytes = (f.keys.end - f.keys.begin - held) * params.kv_token_bytes() +
                            (1 - q_held) * params.q_memory_bytes();
      if (f.rank < 0 || bytes < f.bytes || (bytes == f.bytes && h.rank < f.rank)) {
        f.rank = h.rank;
        f.held = held;
        f.bytes = bytes;
      }
    }
    // The largest floor; ties go to the lowest document id, so the answer does not depend on hash order.
    if (worst.doc_id < 0 || f.bytes > worst.bytes || (f.bytes == worst.bytes && f.doc_id < worst.doc_id)) worst = f;
  }
  return worst;
}

std::string layout_refusal(const MemoryFloor& floor, int64_t cap_bytes) {
  if (cap_bytes <= 0 || floor.doc_id < 0 || floor.bytes <= cap_bytes) return "";
  return "no plan of this layout fits memory cap " + std::to_string(cap_bytes) + " bytes: document " +
         std::to_string(floor.doc_id) + " (" + std::to_string(floor.doc_len) + " tokens) has a last query that reads keys [" +
         std::to_string(floor.keys.begin) + ", " + std::to_string(floor.keys.end) +
         ") on one server, and the rank that would receive least, rank " + std::to_string(floor.rank) + " (holding " +
         std::to_string(floor.held) + " of them), would receive " + std::to_string(floor.bytes) +
         " bytes; raise the cap or lay out fewer tokens of the document per step";
}

std::string plan_refusal(const ServerMemory& memory, int64_t cap_bytes) {
  if (cap_bytes <= 0) return "";
  for (size_t s = 0; s < memory.foreign_bytes.size(); ++s) {
    if (memory.foreign_bytes[s] <= cap_bytes) continue;
    const DocMemory& d = memory.largest[s];
    return "the plan does not fit memory cap " + std::to_string(cap_bytes) + " bytes: server (rank) " +
           std::to_string(s) + " would receive " + std::to_string(memory.foreign_bytes[s]) +
           " bytes, the most of them for document " + std::to_string(d.doc_id) + " (" +
           std::to_string(d.foreign_bytes) + " bytes: " + std::to_string(d.foreign_kv_rows) + " K/V rows and " +
           std::to_string(d.foreign_q_rows) + " query rows from other ranks)";
  }
  return "";
}

}  // namespace cad::workload
