// wire_tables.h -- which rows of a tensor go on the wire, in which order, for one rank of a layout
// (pure data, no CUDA): the index tables the CUDA data path uploads once per plan, and the buffer sizes
// it allocates. Shared with the benchmarks, which time the same copies.
//
// The wire order of one exchange: the rows for (or from) peer 0, then peer 1, ...; inside a peer, the
// route's runs in order. A table maps tensor rows to wire rows ("to_wire": gather before sending) and
// back ("from_wire": scatter after receiving).
#pragma once

#include <cstdint>
#include <vector>

#include "exchange.h"
#include "layout.h"
#include "validate.h"

namespace cad::cad_plugin {

// One row-range copy; the layout of cad::kernels::RowCopy.
struct WireCopy {
  int64_t src_row;
  int64_t dst_row;
  int64_t num_rows;
};

struct WireTable {
  std::vector<WireCopy> to_wire, from_wire;
  std::vector<int64_t> peer_first;     // per peer: its first copy (world + 1 entries)
  std::vector<int64_t> rows_per_peer;  // rows exchanged with each peer
  bool identity = true;                // every copy maps a row onto itself: the tensor is the wire buffer
  // Each peer's rows are ONE contiguous range of the tensor (starting at peer_row[p]): the collective can
  // read or write the tensor itself with per-peer displacements, no copy. Identity is the special case
  // where those ranges also follow each other in peer order (what a contiguous staging copy needs).
  bool direct = true;
  std::vector<int64_t> peer_row;
  std::vector<bool> peer_direct;  // per peer: its rows are one range (`direct` is all of them)
  // Owner side of key/value rows (built when `tokens` is given): partial dK/dV come back from every server
  // that read the row. Rows read by one server only are moved (`single`: wire row -> owner row). A row read
  // by several ("shared", i-th of shared_rows) is the fp32 sum of its wire rows
  // shared_wire_rows[shared_first[i] .. shared_first[i+1]), in peer order, stored at shared_owner_rows[i].
  // `exclusive`: no row is shared. `sum_every_row` (build_wire_table): every row that comes back is treated as
  // shared, so that it is added to what the owner's tensor already holds (its own tasks' partial sums).
  bool exclusive = false;
  std::vector<WireCopy> single;
  std::vector<int64_t> shared_owner_rows, shared_first, shared_wire_rows;
  int64_t shared_rows = 0;
  int64_t rows() const;
};

// `owner_side`: this rank's tensor rows are its own tokens (RowRun::src_row) or its server batch's
// rows (RowRun::dst_row). `q_runs`: query rows (Q, O, LSE, dO, dQ) or key/value rows (K, V, dK, dV).
// `tokens`: the owner's row count (owner side: decides `exclusive`). `sum_every_row`: see WireTable.
WireTable build_wire_table(const Layout& layout, int32_t me, bool owner_side, bool q_runs, int64_t tokens = -1,
                           bool sum_every_row = false);

// ---- One exchange of the CUDA data path (mover.cpp; tests run the same arithmetic on the host) ----
// Its tensors' rows ("parts": Q, K and V; O and LSE; ...) lie per peer one after another, in both buffers (as
// exchange.h's on the CPU path). A rank's rows to itself never enter the collective: where `self_direct` they are
// copied from tensor to tensor beside it (one side holds them as one range: WireTable::peer_direct), else the
// rank packs them into the receive buffer at their place, outside the collective's counts.
struct WirePart {
  int64_t row_bytes = 0;
  const std::vector<int64_t>* send_rows = nullptr;  // rows this rank sends each peer (its side's rows_per_peer)
  const std::vector<int64_t>* recv_rows = nullptr;  // rows it receives from each peer
  bool self_direct = false;
};
struct WirePlacement {
  Transfer transfer;  // the collective's counts and displacements; send_bytes / recv_bytes: the buffers' sizes
  std::vector<std::vector<uint64_t>> send_at, recv_at;  // [part][peer]: where the part's rows for the peer start
};
WirePlacement place_wire_parts(const std::vector<WirePart>& parts, int32_t world, int32_t me);

// A table's copies address its own wire rows, which for `peer` start after the rows of the peers before it:
// a buffer (or tensor) shifted back by that many rows puts the peer's rows where they belong.
int64_t wire_rows_before(const std::vector<int64_t>& rows_per_peer, int32_t peer);

// Device memory the CUDA data path holds per plan on one rank, buffer by buffer (bytes).
struct WorkspaceSizes {
  int64_t tables = 0;        // the index tables, both directions
  int64_t wire = 0;          // the largest send or receive buffer of one of a call's exchanges
  int64_t server_q = 0;      // one Q-shaped server buffer (Q, O, dO, dQ)
  int64_t server_kv = 0;     // one K-shaped server buffer (K, V, dK, dV)
  int64_t server_lse = 0;
  int64_t sum_index = 0;     // the shared dK/dV rows' index (owner rows, offsets, wire rows)
  bool keep_forward_tensors = true;
  // The plan's total: staging x2, dO/dQ/dK/dV, the sum index, and Q/K/V/O/LSE unless they are kept
  // per forward (keep mode: then `saved_per_forward` each forward until its backward).
  int64_t plan_total() const;
  int64_t saved_per_forward() const;
};
WorkspaceSizes workspace_sizes(const Layout& layout, int32_t me, const CallShape& shape, bool keep_forward_tensors,
                               int64_t table_entries, int64_t sum_index_entries);

}  // namespace cad::cad_plugin
