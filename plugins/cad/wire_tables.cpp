// wire_tables.cpp -- see wire_tables.h.
#include "wire_tables.h"

#include <algorithm>

namespace cad::cad_plugin {

namespace {

// Appends a copy of n rows, merging it into the previous copy where both ends continue it.
void append(std::vector<WireCopy>& copies, int64_t src, int64_t dst, int64_t n) {
  if (!copies.empty() && copies.back().src_row + copies.back().num_rows == src &&
      copies.back().dst_row + copies.back().num_rows == dst) {
    copies.back().num_rows += n;
  } else {
    copies.push_back(WireCopy{src, dst, n});
  }
}

// Fills single / shared_* of an owner-side key/value table (see wire_tables.h).
void split_by_readers(WireTable& t, int64_t tokens, bool sum_every_row) {
  const int32_t shared_from = sum_every_row ? 1 : 2;  // readers
  std::vector<int32_t> readers(static_cast<size_t>(tokens), 0);
  for (const WireCopy& c : t.to_wire) {
    for (int64_t r = c.src_row; r < c.src_row + c.num_rows; ++r) {
      if (r >= 0 && r < tokens) ++readers[static_cast<size_t>(r)];
    }
  }
  std::vector<int64_t> index(static_cast<size_t>(tokens), -1);  // each shared owner row's place
  for (int64_t r = 0; r < tokens; ++r) {
    if (readers[static_cast<size_t>(r)] >= shared_from) {
      index[static_cast<size_t>(r)] = t.shared_rows++;
      t.shared_owner_rows.push_back(r);
    }
  }
  // Contributions per shared row, peer after peer (the wire is in peer order): a fixed summation order.
  std::vector<std::vector<int64_t>> contributions(static_cast<size_t>(t.shared_rows));
  for (const WireCopy& c : t.from_wire) {  // wire row -> owner row
    for (int64_t k = 0; k < c.num_rows; ++k) {
      const int64_t owner = c.dst_row + k, wire = c.src_row + k;
      const int64_t i = index[static_cast<size_t>(owner)];
      if (i < 0) {
        append(t.single, wire, owner, 1);
      } else {
        contributions[static_cast<size_t>(i)].push_back(wire);
      }
    }
  }
  t.shared_first.push_back(0);
  for (const auto& list : contributions) {
    t.shared_wire_rows.insert(t.shared_wire_rows.end(), list.begin(), list.end());
    t.shared_first.push_back(static_cast<int64_t>(t.shared_wire_rows.size()));
  }
  t.exclusive = t.shared_rows == 0;
}

}  // namespace

int64_t WireTable::rows() const {
  int64_t n = 0;
  for (int64_t r : rows_per_peer) n += r;
  return n;
}

WireTable build_wire_table(const Layout& layout, int32_t me, bool owner_side, bool q_runs, int64_t tokens,
                           bool sum_every_row) {
  WireTable t;
  t.rows_per_peer.assign(static_cast<size_t>(layout.world), 0);
  int64_t wire = 0;
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    t.peer_first.push_back(static_cast<int64_t>(t.to_wire.size()));
    const Route& route = owner_side ? layout.route(me, peer) : layout.route(peer, me);
    int64_t next = -1;  // the tensor row that continues this peer's range
    t.peer_row.push_back(0);
    t.peer_direct.push_back(true);
    for (const RowRun& run : q_runs ? route.q : route.kv) {
      const int64_t row = owner_side ? run.src_row : run.dst_row;
      if (next < 0) t.peer_row.back() = row;
      if (next >= 0 && row != next) t.peer_direct.back() = false;
      t.direct = t.direct && t.peer_direct.back();
      next = row + run.count;
      t.to_wire.push_back(WireCopy{row, wire, run.count});
      t.from_wire.push_back(WireCopy{wire, row, run.count});
      t.identity = t.identity && row == wire;
      wire += run.count;
    }
    t.rows_per_peer[static_cast<size_t>(peer)] = q_runs ? route.q_rows : route.kv_rows;
  }
  t.peer_first.push_back(static_cast<int64_t>(t.to_wire.size()));
  if (owner_side && tokens >= 0) split_by_readers(t, tokens, sum_every_row);
  return t;
}

WirePlacement place_wire_parts(const std::vector<WirePart>& parts, int32_t world_size, int32_t me) {
  const size_t world = static_cast<size_t>(world_size);
  const size_t self = static_cast<size_t>(me);
  WirePlacement w;
  Transfer& t = w.transfer;
  t.send_counts.assign(world, 0), t.send_displs.assign(world, 0);
  t.recv_counts.assign(world, 0), t.recv_displs.assign(world, 0);
  w.send_at.assign(parts.size(), std::vector<uint64_t>(world, 0));
  w.recv_at = w.send_at;
  for (size_t p = 0; p < world; ++p) {
    t.send_displs[p] = t.send_bytes;
    t.recv_displs[p] = t.recv_bytes;
    for (size_t i = 0; i < parts.size(); ++i) {
      const WirePart& part = parts[i];
      w.send_at[i][p] = t.send_bytes;
      w.recv_at[i][p] = t.recv_bytes;
      if (p != self) t.send_bytes += static_cast<uint64_t>((*part.send_rows)[p] * part.row_bytes);
      if (p != self || !part.self_direct) t.recv_bytes += static_cast<uint64_t>((*part.recv_rows)[p] * part.row_bytes);
    }
    t.send_counts[p] = t.send_bytes - t.send_displs[p];
    t.recv_counts[p] = p == self ? 0 : t.recv_bytes - t.recv_displs[p];
  }
  return w;
}

int64_t wire_rows_before(const std::vector<int64_t>& rows_per_peer, int32_t peer) {
  int64_t rows = 0;
  for (int32_t p = 0; p < peer; ++p) rows += rows_per_peer[static_cast<size_t>(p)];
  return rows;
}

int64_t WorkspaceSizes::plan_total() const {
  int64_t total = 2 * tables + 2 * wire + 2 * server_q + 2 * server_kv + sum_index;  // dO dQ, dK dV
  if (!keep_forward_tensors) total += 2 * server_q + 2 * server_kv + server_lse;  // Q O, K V, LSE
  return total;
}

int64_t WorkspaceSizes::saved_per_forward() const {
  return keep_forward_tensors ? 2 * server_q + 2 * server_kv + server_lse : 0;
}

WorkspaceSizes workspace_sizes(const Layout& layout, int32_t me, const CallShape& s, bool keep_forward_tensors,
                               int64_t table_entries, int64_t sum_index_entries) {
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
  w.sum_index = sum_index_entries * static_cast<int64_t>(sizeof(int64_t));
  w.keep_forward_tensors = keep_forward_tensors;
  return w;
}

}  // namespace cad::cad_plugin
