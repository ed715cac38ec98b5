// plan_checks.cpp -- see plan_checks.h.
#include "plan_checks.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace cad::conformance {

void PieceTables::refresh_views() {
  views.clear();
  for (const auto& rank : ranks) {
    views.push_back(cad_rank_pieces_v1_t{rank.empty() ? nullptr : rank.data(), static_cast<int64_t>(rank.size())});
  }
}

int64_t PieceTables::num_documents() const {
  std::map<int64_t, int> docs;
  for (const auto& rank : ranks) {
    for (const auto& piece : rank) docs[piece.doc_id] = 1;
  }
  return static_cast<int64_t>(docs.size());
}

PieceTables random_piece_tables(int num_ranks, int empty_ranks, std::mt19937_64& rng) {
  const auto between = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  PieceTables tables;
  tables.ranks.resize(static_cast<size_t>(num_ranks));
  const int filled = std::max(1, num_ranks - empty_ranks);
  const int64_t capacity = between(64, 256);  // tokens per rank buffer
  int64_t doc_id = between(0, 5) * 1000;      // ids need not start at 0 nor be contiguous

  // Packed documents: each rank's buffer filled in order; a document that overflows continues on the next.
  int rank = 0;
  int64_t used = 0;
  while (rank < filled) {
    const int kind = static_cast<int>(between(0, 9));
    const int64_t len = kind == 0 ? 1 : kind <= 6 ? between(2, 60) : kind <= 8 ? between(61, capacity) : capacity * 2 + 3;
    int64_t offset = 0;
    while (offset < len && rank < filled) {
      const int64_t take = std::min(len - offset, capacity - used);
      tables.ranks[rank].push_back(cad_piece_v1_t{doc_id, len, offset, take});
      offset += take;
      used += take;
      if (used == capacity) {
        ++rank;
        used = 0;
      }
    }
    if (offset < len) {
      // The last document did not fit: keep the pieces that did, as its own shorter document.
      for (auto& r : tables.ranks) {
        for (auto& piece : r) {
          if (piece.doc_id == doc_id) piece.doc_len = offset;
        }
      }
    }
    doc_id += between(1, 3);
  }
  // Host-split documents: cut into 2-4 pieces dealt to random non-empty ranks, appended
  // out of document order.
  for (int extra = 0; extra < 3; ++extra) {
    const int64_t len = between(3, 90);
    const int64_t cuts = std::min<int64_t>(len, between(2, 4));
    std::vector<int64_t> bounds = {0, len};
    while (static_cast<int64_t>(bounds.size()) < cuts + 1) {
      const int64_t c = between(1, len - 1);
      if (std::find(bounds.begin(), bounds.end(), c) == bounds.end()) bounds.push_back(c);
    }
    std::sort(bounds.begin(), bounds.end());
    for (size_t i = bounds.size() - 1; i-- > 0;) {
      const int target = static_cast<int>(between(0, filled - 1));  // empty ranks stay empty
      tables.ranks[target].push_back(cad_piece_v1_t{doc_id, len, bounds[i], bounds[i + 1] - bounds[i]});
    }
    doc_id += 7;
  }
  // Which ranks are empty should not always be the last ones.
  std::shuffle(tables.ranks.begin(), tables.ranks.end(), rng);
  tables.refresh_views();
  return tables;
}

std::string plan_violation(const PieceTables& tables, int num_servers, const cad_plan_v1_t& plan) {
  const auto str = [](int64_t x) { return std::to_string(x); };
  if (plan.format_version != CAD_PLAN_FORMAT_VERSION) return "format_version is " + str(plan.format_version);
  if (plan.num_servers != num_servers) return "num_servers is " + str(plan.num_servers) + ", expected " + str(num_servers);
  if (plan.num_tasks < 0 || (plan.num_tasks > 0 && plan.tasks == nullptr)) return "tasks NULL or num_tasks negative";
  std::map<int64_t, int64_t> doc_len;
  for (const auto& rank : tables.ranks) {
    for (const auto& piece : rank) doc_len[piece.doc_id] = piece.doc_len;
  }
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> ranges;  // doc -> [q_begin, q_end)
  for (int64_t i = 0; i < plan.num_tasks; ++i) {
    const cad_task_v1_t& t = plan.tasks[i];
    const std::string at = "task " + str(i) + " (doc " + str(t.doc_id) + ", [" + str(t.q_begin) + ", " +
                           str(t.q_end) + "), server " + str(t.server) + ")";
    if (t.server < 0 || t.server >= num_servers) return at + ": server out of range";
    if (t.reserved != 0) return at + ": reserved is not 0";
    const auto doc = doc_len.find(t.doc_id);
    if (doc == doc_len.end()) return at + ": unknown document";
    if (t.q_begin < 0 || t.q_begin >= t.q_end || t.q_end > doc->second) {
      return at + ": not a non-empty range inside the document of length " + str(doc->second);
    }
    if (i > 0) {
      const cad_task_v1_t& p = plan.tasks[i - 1];
      if (std::make_tuple(p.server, p.doc_id, p.q_begin) >= std::make_tuple(t.server, t.doc_id, t.q_begin)) {
        return at + ": not sorted by (server, doc_id, q_begin) after task " + str(i - 1);
      }
    }
    ranges[t.doc_id].push_back({t.q_begin, t.q_end});
  }
  for (const auto& [doc, len] : doc_len) {
    auto& r = ranges[doc];
    std::sort(r.begin(), r.end());
    int64_t next = 0;
    for (const auto& [begin, end] : r) {
      if (begin != next) {
        return "doc " + str(doc) + ": queries " + (begin < next ? "covered twice" : "not covered") + " at " +
               str(std::min(begin, next));
      }
      next = end;
    }
    if (next != len) return "doc " + str(doc) + ": queries [" + str(next) + ", " + str(len) + ") not covered";
  }
  return "";
}

}  // namespace cad::conformance
