// layout.cpp -- see layout.h.
#include "layout.h"

#include <algorithm>
#include <map>

#include "key_range.h"
#include "plan_model.h"

namespace cad::cad_plugin {
namespace {

// Where the tokens of one document live: its pieces in document order, with the row each piece
// starts at on its owner.
struct PieceRef {
  int32_t owner;
  int64_t offset_in_doc;
  int64_t len;
  int64_t owner_row;
};

struct DocPlacement {
  int64_t doc_len = 0;
  std::vector<PieceRef> pieces;  // sorted by offset_in_doc; they tile [0, doc_len)
};

// std::map, not unordered_map: iteration order must be the same on every rank.
std::map<int64_t, DocPlacement> index_documents(const PieceTables& tables) {
  std::map<int64_t, DocPlacement> docs;
  for (size_t rank = 0; rank < tables.size(); ++rank) {
    int64_t row = 0;
    for (const cad_piece_v1_t& p : tables[rank]) {
      DocPlacement& doc = docs[p.doc_id];
      doc.doc_len = p.doc_len;
      doc.pieces.push_back(PieceRef{static_cast<int32_t>(rank), p.offset_in_doc, p.len, row});
      row += p.len;
    }
  }
  for (auto& entry : docs) {
    std::sort(entry.second.pieces.begin(), entry.second.pieces.end(),
              [](const PieceRef& a, const PieceRef& b) { return a.offset_in_doc < b.offset_in_doc; });
  }
  return docs;
}

// Appends a run, merging it into the previous one when both ends continue it (fewer copies later).
void append_run(std::vector<RowRun>& runs, int64_t src_row, int64_t dst_row, int64_t count) {
  if (count <= 0) return;
  if (!runs.empty()) {
    RowRun& last = runs.back();
    if (last.src_row + last.count == src_row && last.dst_row + last.count == dst_row) {
      last.count += count;
      return;
    }
  }
  runs.push_back(RowRun{src_row, dst_row, count});
}

// A server's tasks of a document it holds whole in one piece, as segments over its own rows: each task's
// queries, and the keys it needs where they lie (the causal prefix from the first key its window reaches,
// or the whole document), so no copy is shared or made.
void add_own_segments(ServerBatch& own, const DocPlacement& doc, const cad_task_v1_t* begin, const cad_task_v1_t* end,
                      bool causal, int64_t window_left) {
  const int64_t row = doc.pieces[0].owner_row;  // of document position 0
  for (const cad_task_v1_t* t = begin; t != end; ++t) {
    if (t->q_end <= t->q_begin) continue;
    const int64_t kv_lo = mask::visible_keys(t->q_begin, doc.doc_len, causal, window_left, -1).begin;  // key_range.h
    const int64_t kv_end = plan::task_kv_end(t->q_begin, t->q_end, doc.doc_len, causal);
    own.segments.push_back(cad_segment_v1_t{row + t->q_begin, t->q_end - t->q_begin, row + kv_lo, kv_end - kv_lo});
  }
}

}  // namespace

int64_t rows_in(const std::vector<RowRun>& runs) {
  int64_t rows = 0;
  for (const RowRun& r : runs) rows += r.count;
  return rows;
}

Layout build_layout(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks_in, bool causal,
                    int64_t window_left, bool own_in_place) {
  const int32_t world = static_cast<int32_t>(tables.size());
  Layout layout;
  layout.world = world;
  layout.routes.resize(static_cast<size_t>(world) * static_cast<size_t>(world));
  layout.servers.resize(static_cast<size_t>(world));
  layout.own.resize(static_cast<size_t>(world));

  const std::map<int64_t, DocPlacement> docs = index_documents(tables);

  std::vector<cad_task_v1_t> tasks = tasks_in;
  std::sort(tasks.begin(), tasks.end(), [](const cad_task_v1_t& a, const cad_task_v1_t& b) {
    if (a.server != b.server) return a.server < b.server;
    if (a.doc_id != b.doc_id) return a.doc_id < b.doc_id;
    return a.q_begin < b.q_begin;
  });

  // Walk the tasks grouped by (server, document).
  size_t first = 0;
  while (first < tasks.size()) {
    size_t end = first;
    while (end < tasks.size() && tasks[end].server == tasks[first].server && tasks[end].doc_id == tasks[first].doc_id) {
      ++end;
    }
    const int32_t server = tasks[first].server;
    const DocPlacement& doc = docs.at(tasks[first].doc_id);
    if (own_in_place && doc.pieces.size() == 1 && doc.pieces[0].owner == server) {
      add_own_segments(layout.own[static_cast<size_t>(server)], doc, &tasks[first], &tasks[end], causal, window_left);
      first = end;
      continue;
    }
    ServerBatch& batch = layout.servers[static_cast<size_t>(server)];

    // One shared copy of the KV range [kv_lo, kv_need) that this server's tasks of the document need: the
    // prefix up to the longest task's end, from the first key the earliest task's window reaches.
    const bool windowed = causal && window_left >= 0;
    int64_t kv_need = 0;
    int64_t kv_lo = windowed ? doc.doc_len : 0;
    for (size_t t = first; t < end; ++t) {
      kv_need = std::max(kv_need, plan::task_kv_end(tasks[t].q_begin, tasks[t].q_end, doc.doc_len, causal));
      if (windowed) kv_lo = std::min(kv_lo, mask::visible_keys(tasks[t].q_begin, doc.doc_len, causal, window_left, -1).begin);
    }
    const int64_t kv_base = batch.kv_rows;  // server row of document key kv_lo
    for (const PieceRef& piece : doc.pieces) {
      const int64_t lo = std::max(piece.offset_in_doc, kv_lo);
      const int64_t hi = std::min(piece.offset_in_doc + piece.len, kv_need);
      if (hi <= lo) continue;
      Route& route = layout.route(piece.owner, server);
      append_run(route.kv, piece.owner_row + (lo - piece.offset_in_doc), kv_base + (lo - kv_lo), hi - lo);
      route.kv_rows += hi - lo;
    }
    batch.kv_rows += kv_need - kv_lo;

    // The queries: one segment per (task, piece) intersection.
    for (size_t t = first; t < end; ++t) {
      const cad_task_v1_t& task = tasks[t];
      for (const PieceRef& piece : doc.pieces) {
        const int64_t lo = std::max(task.q_begin, piece.offset_in_doc);
        const int64_t hi = std::min(task.q_end, piece.offset_in_doc + piece.len);
        if (hi <= lo) continue;
        Route& route = layout.route(piece.owner, server);
        append_run(route.q, piece.owner_row + (lo - piece.offset_in_doc), batch.q_rows, hi - lo);
        route.q_rows += hi - lo;
        // Bottom-right causal alignment: with kv_len = hi - kv_lo, query i of the segment (document position
        // lo + i) sees keys j <= i + (kv_len - q_len) = lo + i - kv_lo, exactly the causal mask (and the
        // window) in the copy's positions, which start at document position kv_lo.
        batch.segments.push_back(cad_segment_v1_t{batch.q_rows, hi - lo, kv_base, causal ? hi - kv_lo : doc.doc_len});
        batch.q_rows += hi - lo;
      }
    }
    first = end;
  }
  for (size_t rank = 0; rank < layout.own.size(); ++rank) {
    ServerBatch& own = layout.own[rank];
    if (own.segments.empty()) continue;
    for (const cad_piece_v1_t& p : tables[rank]) own.q_rows += p.len;
    own.kv_rows = own.q_rows;
  }
  return layout;
}

}  // namespace cad::cad_plugin
