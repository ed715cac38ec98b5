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
//    the server point into that copy (shared KV).
//  - A server's documents ("groups": its tasks of one document, their Q rows and their K/V copy) follow in
//    owner order: by the lowest, then the highest rank holding a row the group reads, then doc_id. For
//    batches packed rank after rank with rising ids that is doc_id order; in general it keeps each owner's
//    rows together (in-place exchanges) and puts the groups that read only the server's own rows ("local":
//    lowest = highest = the server) next to each other, so that they form one part (BatchPart) the server can
//    compute before the exchange brings the other owners' rows (overlap_local).
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

// A run of consecutive groups of a server batch: Q rows [q_row, q_row + q_rows), K/V rows [kv_row, kv_row +
// kv_rows) and segments [first_segment, first_segment + num_segments) of the batch, read by no segment outside
// the part (a group's segments share only their own K/V copy). So one server backend call over these rows
// computes exactly the part's tasks: the batch splits into independent calls without touching any merge rule.
struct BatchPart {
  int64_t q_row = 0, q_rows = 0;
  int64_t kv_row = 0, kv_rows = 0;
  int64_t first_segment = 0, num_segments = 0;
  int64_t tasks = 0;          // the balancer's tasks in it
  int64_t score_entries = 0;  // their cost (plan_model.h task_cost), for the stats
  // Every Q and K/V row it reads is the server's own (owner == server): nothing of it travels, so the server
  // can compute it while the exchange brings the rest (the one place this rule lives).
  bool local = false;
};

struct ServerBatch {
  int64_t q_rows = 0;   // Tq of the server batch
  int64_t kv_rows = 0;  // Tk of the server batch
  std::vector<cad_segment_v1_t> segments;
  // The batch cut where the groups switch between local and not (at most three parts: the local groups are
  // next to each other, see above); empty when the batch is.
  std::vector<BatchPart> parts;
};

struct Layout {
  int32_t world = 0;
  std::vector<Route> routes;  // world * world, index owner * world + server
  std::vector<ServerBatch> servers;

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
Layout build_layout(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks, bool causal,
                    int64_t window_left = -1);

// Rows a run list covers.
int64_t rows_in(const std::vector<RowRun>& runs);

}  // namespace cad::cad_plugin
