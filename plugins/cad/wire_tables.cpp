// wire_tables.cpp -- see wire_tables.h.
#include "wire_tables.h"

#include <algorithm>

namespace cad::cad_plugin {

namespace {

// Appends a copy of n rows, merging it into the previous copy where both ends continue it -- but never into
// a copy before index `floor` (the per-peer add lists must not mix peers: one peer's copies run in one
// launch, and two peers adding to the same row in one launch would race).
void append(std::vector<WireCopy>& copies, int64_t src, int64_t dst, int64_t n, size_t floor = 0) {
  if (copies.size() > floor && copies.back().src_row + copies.back().num_rows == src &&
      copies.back().dst_row + copies.back().num_rows == dst) {
    copies.back().num_rows += n;
  } else {
    copies.push_back(WireCopy{src, dst, n});
  }
}

// Fills single / shared_* of an owner-side key/value table (see wire_tables.h).
void split_by_readers(WireTable& t, int64_t tokens) {
  std::vector<int32_t> readers(static_cast<size_t>(tokens), 0);
  for (const WireCopy& c : t.to_wire) {
    for (int64_t r = c.src_row; r < c.src_row + c.num_rows; ++r) {
      if (r >= 0 && r < tokens) ++readers[static_cast<size_t>(r)];
    }
  }
  std::vector<int64_t> acc(static_cast<size_t>(tokens), -1);  // accumulator row of each shared owner row
  for (int64_t r = 0; r < tokens; ++r) {
    if (readers[static_cast<size_t>(r)] > 1) {
      append(t.shared_store, t.shared_rows, r, 1);
      acc[static_cast<size_t>(r)] = t.shared_rows++;
    }
  }
  const size_t peers = t.peer_first.size() - 1;
  for (size_t p = 0; p < peers; ++p) {
    t.shared_peer_first.push_back(static_cast<int64_t>(t.shared_adds.size()));
    const size_t peer_floor = t.shared_adds.size();
    for (int64_t i = t.peer_first[p]; i < t.peer_first[p + 1]; ++i) {
      const WireCopy& c = t.from_wire[static_cast<size_t>(i)];  // wire row -> owner row
      for (int64_t k = 0; k < c.num_rows; ++k) {
        const int64_t owner = c.dst_row + k, wire = c.src_row + k;
        const int64_t a = acc[static_cast<size_t>(owner)];
        if (a < 0) {
          append(t.single, wire, owner, 1);
        } else {
          append(t.shared_adds, wire, a, 1, peer_floor);
        }
      }
    }
  }
  t.shared_peer_first.push_back(static_cast<int64_t>(t.shared_adds.size()));
  t.exclusive = t.shared_rows == 0;
}

}  // namespace

int64_t WireTable::rows() const {
  int64_t n = 0;
  for (int64_t r : rows_per_peer) n += r;
  return n;
}

WireTable build_wire_table(const Layout& layout, int32_t me, bool owner_side, bool q_runs, int64_t tokens) {
  WireTable t;
  t.rows_per_peer.assign(static_cast<size_t>(layout.world), 0);
  int64_t wire = 0;
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    t.peer_first.push_back(static_cast<int64_t>(t.to_wire.size()));
    const Route& route = owner_side ? layout.route(me, peer) : layout.route(peer, me);
    int64_t next = -1;  // the tensor row that continues this peer's range
    t.peer_row.push_back(0);
    for (const RowRun& run : q_runs ? route.q : route.kv) {
      const int64_t row = owner_side ? run.src_row : run.dst_row;
      if (next < 0) t.peer_row.back() = row;
      t.direct = t.direct && (next < 0 || row == next);
      next = row + run.count;
      t.to_wire.push_back(WireCopy{row, wire, run.count});
      t.from_wire.push_back(WireCopy{wire, row, run.count});
      t.identity = t.identity && row == wire;
      wire += run.count;
    }
    t.rows_per_peer[static_cast<size_t>(peer)] = q_runs ? route.q_rows : route.kv_rows;
  }
  t.peer_first.push_back(static_cast<int64_t>(t.to_wire.size()));
  if (owner_side && tokens >= 0) split_by_readers(t, tokens);
  return t;
}

int64_t WorkspaceSizes::plan_total() const {
  int64_t total = 2 * tables + 2 * wire + 2 * server_q + 2 * server_kv + 2 * accumulator;  // dO dQ, dK dV
  if (!keep_forward_tensors) total += 2 * server_q + 2 * server_kv + server_lse;  // Q O, K V, LSE
  return total;
}

int64_t WorkspaceSizes::saved_per_forward() const {
  return keep_forward_tensors ? 2 * server_q + 2 * server_kv + server_lse : 0;
}

WorkspaceSizes workspace_sizes(const Layout& layout, int32_t me, const CallShape& s, bool keep_forward_tensors,
                               int64_t table_entries, int64_t shared_kv_rows) {
  const ServerBatch& batch = layout.servers[static_cast<size_t>(me)];
  int64_t owner_q = 0, owner_kv = 0, server_q = 0, server_kv = 0;
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    owner_q += layout.route(me, peer).q_rows;
    owner_kv += layout.route(me, peer).kv_rows;
    server_q += layout.route(peer, me).q_rows;
    server_kv += layout.route(peer, me).kv_rows;
  }
  WorkspaceSizes w;
  w.tables = table_entries * static_cast<int64_t>(sizeof(WireCopy));
  w.wire = std::max(std::max(owner_q, server_q) * s.q_row_bytes(), std::max(owner_kv, server_kv) * s.kv_row_bytes());
  w.server_q = batch.q_rows * s.q_row_bytes();
  w.server_kv = batch.kv_rows * s.kv_row_bytes();
  w.server_lse = batch.q_rows * int64_t{s.num_q_heads} * 4;
  w.accumulator = shared_kv_rows * int64_t{s.num_kv_heads} * s.head_dim * 4;
  w.keep_forward_tensors = keep_forward_tensors;
  return w;
}

}  // namespace cad::cad_plugin
