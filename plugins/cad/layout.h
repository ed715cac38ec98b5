// layout.h -- the dispatch layout of one CAD step: which rows move where. Pure data, no I/O.
//
// From the piece tables of all ranks and the balancer's plan, every rank derives the same layout:
//  - for each (owner, server) pair, the runs of query rows and of key/value rows the owner sends;
//  - for each server, its batch: how many Q rows and K/V rows it receives and the segment table that
//    the server-side attention backend runs on them.
// Conventions:
//  - An owner's rows are its tokens in the host's order (the concatenation of its pieces).
//  - A server's Q rows follow its tasks sorted by (doc_id, q_begin); a task whose queries are held by
//    several pieces becomes one segment per piece, so that every segment's Q rows are contiguous on
//    the owner and on the server.
//  - A server's K/V rows hold, per document it serves, ONE copy of the longest prefix its tasks of that
//    document need ([0, max q_end) causal, [0, doc_len) non-causal); all of that document's segments on
//    the server point into that copy (shared KV). Documents follow in doc_id order.
//  - With a causal sliding window (window_left >= 0) the copy starts at kv_lo = min over those tasks of
//    max(0, q_begin - window_left) instead of 0: [kv_lo, max q_end). A segment of queries [lo, hi) then
//    reads K/V rows [kv_lo, hi) of the document, so by the bottom-right alignment its query i stands at
//    key position lo + i - kv_lo: document positions shifted by kv_lo, and the window, a difference of
//    positions, is the document's.
#pragma once

#include <cstdint>
#include <vector>

#include "cad_common_v1.h"

namespace cad::cad_plugin {

// The pieces of every rank, indexed by rank, each in that rank's token order.
using PieceTables = std::vector<std::vector<cad_piece_v1_t>>;

// `count` consecutive rows: rows [src_row, src_row+count) of the owner correspond to rows
// [dst_row, dst_row+count) of the server.
struct RowRun {
  int64_t src_row;  // row on the owner (its token order)
  int64_t dst_row;  // row in the server batch
  int64_t count;
};

// What one owner sends one server (and, reversed, what comes back).
struct Route {
  std::vector<RowRun> q;   // query rows (also O, LSE, dO, dQ)
  std::vector<RowRun> kv;  // key/value rows (also dK, dV)
  int64_t q_rows = 0;
  int64_t kv_rows = 0;
};

struct ServerBatch {
  int64_t q_rows = 0;   // Tq of the server batch
  int64_t kv_rows = 0;  // Tk of the server batch
  std::vector<cad_segment_v1_t> segments;
};

struct Layout {
  int32_t world = 0;
  std::vector<Route> routes;  // world * world, index owner * world + server
  std::vector<ServerBatch> servers;
  // Per rank, the tasks it runs in place on its own tensors (build_layout's `own_in_place`): segments over its
  // own token rows (q_rows = kv_rows = its tokens where it has any, else 0). They are in no route and in no
  // server batch: nothing of them moves, and a server can compute them while the moved rows are in flight.
  std::vector<ServerBatch> own;

  const Route& route(int32_t owner, int32_t server) const {
    return routes[static_cast<size_t>(owner) * static_cast<size_t>(world) + static_cast<size_t>(server)];
  }
  Route& route(int32_t owner, int32_t server) {
    return routes[static_cast<size_t>(owner) * static_cast<size_t>(world) + static_cast<size_t>(server)];
  }
};

// Builds the layout. `tables` must be valid (see validate.h: check_piece_tables) and `tasks` a valid
// plan over them (check_plan); servers are 0..tables.size()-1. Deterministic; task order in the input
// does not matter.
// `own_in_place`: a task whose server holds its whole document in one piece goes to `own[server]` (a
// segment per task over the server's own rows, reading the keys it needs where they lie) instead of the
// server batch. The rule that decides what a server can compute before anything arrives lives here only.
Layout build_layout(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks, bool causal,
                    int64_t window_left = -1, bool own_in_place = false);

// Rows a run list covers.
int64_t rows_in(const std::vector<RowRun>& runs);

}  // namespace cad::cad_plugin
