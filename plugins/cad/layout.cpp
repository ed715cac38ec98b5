// layout.cpp -- see layout.h.
#include "layout.h"

#include <algorithm>
#include <map>

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

}  // namespace

int64_t rows_in(const std::vector<RowRun>& runs) {
  int64_t rows = 0;
  for (const RowRun& r : runs) rows += r.count;
  return rows;
}

Layout build_layout(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks_in, bool causal,
                    int64_t window_left) {
  const int32_t world = static_cast<int32_t>(tables.size());
  Layout layout;
  layout.world = world;
  layout.routes.resize(static_cast<size_t>(world) * static_cast<size_t>(world));
  layout.servers.resize(static_cast<size_t>(world));

  const std::map<int64_t, DocPlacement> docs = index_documents(tables);

  std::vector<cad_task_v1_t> tasks = tasks_in;
  std::sort(tasks.begin(), tasks.end(), [](const cad_task_v1_t& a, const cad_task_v1_t& b) {
    if (a.server != b.server) return a.server < b.server;
    if (a.doc_id != b.doc_id) return a.doc_id < b.doc_id;
    return a.q_begin < b.q_begin;
  });

  // The tasks grouped by (server, document), then each server's groups in owner order (layout.h).
  const bool windowed = causal && window_left >= 0;
  plan::ModelParams cost_params;  // only the mask matters to task_cost
  cost_params.causal = causal;
  cost_params.window_left = windowed ? window_left : -1;
  struct Group {
    size_t first, end;        // its tasks in `tasks`
    int64_t kv_lo, kv_need;   // the K/V copy: document keys [kv_lo, kv_need)
    int32_t lowest, highest;  // ranks holding a row it reads
  };
  std::vector<Group> groups;
  for (size_t first = 0, end = 0; first < tasks.size(); first = end) {
    while (end < tasks.size() && tasks[end].server == tasks[first].server && tasks[end].doc_id == tasks[first].doc_id) {
      ++end;
    }
    const DocPlacement& doc = docs.at(tasks[first].doc_id);
    // One shared copy of the KV range [kv_lo, kv_need) that this server's tasks of the document need: the
    // prefix up to the longest task's end, from the first key the earliest task's window reaches. It holds
    // every query of the group too (q_begin >= kv_lo, q_end <= kv_need), so its pieces are all the group reads.
    Group g{first, end, windowed ? doc.doc_len : 0, 0, world, -1};
    for (size_t t = first; t < end; ++t) {
      g.kv_need = std::max(g.kv_need, plan::task_kv_end(tasks[t].q_begin, tasks[t].q_end, doc.doc_len, causal));
      if (windowed) g.kv_lo = std::min(g.kv_lo, std::max<int64_t>(0, tasks[t].q_begin - window_left));
    }
    for (const PieceRef& piece : doc.pieces) {
      if (piece.offset_in_doc < g.kv_need && piece.offset_in_doc + piece.len > g.kv_lo) {
        g.lowest = std::min(g.lowest, piece.owner);
        g.highest = std::max(g.highest, piece.owner);
      }
    }
    groups.push_back(g);
  }
  // Stable: groups of one (server, lowest, highest) keep their doc_id order.
  std::stable_sort(groups.begin(), groups.end(), [&](const Group& a, const Group& b) {
    const cad_task_v1_t &ta = tasks[a.first], &tb = tasks[b.first];
    if (ta.server != tb.server) return ta.server < tb.server;
    if (a.lowest != b.lowest) return a.lowest < b.lowest;
    return a.highest < b.highest;
  });

  for (const Group& g : groups) {
    const int32_t server = tasks[g.first].server;
    const DocPlacement& doc = docs.at(tasks[g.first].doc_id);
    ServerBatch& batch = layout.servers[static_cast<size_t>(server)];
    const bool local = g.lowest == server && g.highest == server;
    if (batch.parts.empty() || batch.parts.back().local != local) {
      BatchPart part;
      part.q_row = batch.q_rows;
      part.kv_row = batch.kv_rows;
      part.first_segment = static_cast<int64_t>(batch.segments.size());
      part.local = local;
      batch.parts.push_back(part);
    }
    BatchPart& part = batch.parts.back();
    const int64_t segments_before = static_cast<int64_t>(batch.segments.size());
    const int64_t q_before = batch.q_rows;

    const int64_t kv_base = batch.kv_rows;  // server row of document key kv_lo
    for (const PieceRef& piece : doc.pieces) {
      const int64_t lo = std::max(piece.offset_in_doc, g.kv_lo);
      const int64_t hi = std::min(piece.offset_in_doc + piece.len, g.kv_need);
      if (hi <= lo) continue;
      Route& route = layout.route(piece.owner, server);
      append_run(route.kv, piece.owner_row + (lo - piece.offset_in_doc), kv_base + (lo - g.kv_lo), hi - lo);
      route.kv_rows += hi - lo;
    }
    batch.kv_rows += g.kv_need - g.kv_lo;

    // The queries: one segment per (task, piece) intersection.
    for (size_t t = g.first; t < g.end; ++t) {
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
        batch.segments.push_back(
            cad_segment_v1_t{batch.q_rows, hi - lo, kv_base, causal ? hi - g.kv_lo : doc.doc_len});
        batch.q_rows += hi - lo;
      }
      part.score_entries += plan::task_cost(task.q_begin, task.q_end, doc.doc_len, cost_params);
    }
    part.tasks += static_cast<int64_t>(g.end - g.first);
    part.q_rows += batch.q_rows - q_before;
    part.kv_rows += g.kv_need - g.kv_lo;
    part.num_segments += static_cast<int64_t>(batch.segments.size()) - segments_before;
  }
  return layout;
}

}  // namespace cad::cad_plugin
