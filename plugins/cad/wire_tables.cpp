// wire_tables.cpp -- see wire_tables.h.
#include "wire_tables.h"

#include <algorithm>
#include <iterator>

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

// Whether a run list's rows on one side (the owner's: src rows, else the server's: dst rows) are one range, in
// run order (WireTable::peer_direct).
bool one_range(const std::vector<RowRun>& runs, bool owner_side) {
  for (size_t i = 1; i < runs.size(); ++i) {
    const RowRun& a = runs[i - 1];
    const RowRun& b = runs[i];
    if ((owner_side ? b.src_row : b.dst_row) != (owner_side ? a.src_row : a.dst_row) + a.count) return false;
  }
  return true;
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
    const std::vector<RowRun>& runs = q_runs ? route.q : route.kv;
    t.peer_row.push_back(runs.empty() ? 0 : owner_side ? runs.front().src_row : runs.front().dst_row);
    t.peer_direct.push_back(one_range(runs, owner_side));
    t.direct = t.direct && t.peer_direct.back();
    for (const RowRun& run : runs) {
      const int64_t row = owner_side ? run.src_row : run.dst_row;
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
  int64_t owner_q = 0, owner_kv = 0, server_q = 0, server_kv = 0;  // rows to / from the other ranks
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    if (peer == me) continue;
    owner_q += layout.route(me, peer).q_rows;
    owner_kv += layout.route(me, peer).kv_rows;
    server_q += layout.route(peer, me).q_rows;
    server_kv += layout.route(peer, me).kv_rows;
  }
  // The calls' exchanges (device_path.cpp: per direction one collective of the rows for the other ranks), each the
  // larger of its two buffers. A rank's own rows pass through the receive buffer where neither side holds them
  // as one range, and always for LSE and summed dK/dV (counted for every dK/dV: an upper bound).
  const Route& own = layout.route(me, me);
  const int64_t own_q = (one_range(own.q, true) || one_range(own.q, false)) ? 0 : own.q_rows;
  const int64_t own_kv = (one_range(own.kv, true) || one_range(own.kv, false)) ? 0 : own.kv_rows;
  const int64_t qb = s.q_row_bytes(), kvb = s.kv_row_bytes(), lse = int64_t{s.num_q_heads} * 4;
  const int64_t resent = keep_forward_tensors ? 0 : 1;  // a backward without kept state re-sends Q, O, LSE, K, V
  const int64_t exchanges[] = {
      // Q, K, V in
      std::max(owner_q * qb + 2 * owner_kv * kvb, (server_q + own_q) * qb + 2 * (server_kv + own_kv) * kvb),
      // O, LSE back
      std::max(server_q * (qb + lse), (owner_q + own_q) * qb + (owner_q + own.q_rows) * lse),
      // dO (and Q, O, LSE, K, V) in
      std::max(owner_q * (qb + resent * (2 * qb + lse)) + resent * 2 * owner_kv * kvb,
               (server_q + own_q) * qb * (1 + 2 * resent) +
                   resent * ((server_q + own.q_rows) * lse + 2 * (server_kv + own_kv) * kvb)),
      std::max(server_q, owner_q + own_q) * qb,               // dQ back
      std::max(server_kv, owner_kv + own.kv_rows) * kvb,      // dK, dV back (each)
  };
  WorkspaceSizes w;
  w.tables = table_entries * static_cast<int64_t>(sizeof(WireCopy));
  w.wire = *std::max_element(std::begin(exchanges), std::end(exchanges));
  w.server_q = batch.q_rows * qb;
  w.server_kv = batch.kv_rows * kvb;
  w.server_lse = batch.q_rows * lse;
  w.sum_index = sum_index_entries * static_cast<int64_t>(sizeof(int64_t));
  w.keep_forward_tensors = keep_forward_tensors;
  return w;
}

}  // namespace cad::cad_plugin
