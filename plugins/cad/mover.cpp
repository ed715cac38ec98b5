// mover.cpp -- see mover.h.
#include "mover.h"

#include "cuda_check.h"
#include "wire_device.h"

namespace cad::cad_plugin {

Mover::Mover(CadContext& ctx, DevicePlan& plan, CallScratch& scratch, cudaStream_t stream, bool drain, CallStats& stats)
    : ctx_(ctx), plan_(plan), scratch_(scratch), stream_(stream), drain_(drain), stats_(stats),
      wire_(make_device_wire(ctx, plan, stream)) {}

Mover::InFlight Mover::start(Direction direction, std::vector<Slice> slices, bool kv_sums) {
  const bool to_servers = direction == Direction::ToServers;
  InFlight f;
  f.direction = direction;
  f.slices = std::move(slices);
  f.kv_sums = kv_sums;
  std::vector<WirePart> parts;
  for (const Slice& slice : f.slices) {
    f.self_direct.push_back(self_direct(slice, to_servers, kv_sums));
    parts.push_back(WirePart{slice.row_bytes, &wire_rows(slice.set, to_servers), &wire_rows(slice.set, !to_servers),
                             f.self_direct.back()});
  }
  WirePlacement placed = place_wire_parts(parts, static_cast<int32_t>(plan_.owner_q_rows.size()), ctx_.comm->rank());
  const Transfer& t = placed.transfer;
  const std::vector<std::vector<uint64_t>>& send_at = placed.send_at;
  f.recv_at = std::move(placed.recv_at);
  f.send = t.send_bytes > 0 ? static_cast<std::byte*>(scratch_.take(t.send_bytes, "the send buffer")) : nullptr;
  f.recv = t.recv_bytes > 0 ? static_cast<std::byte*>(scratch_.take(t.recv_bytes, "the receive buffer")) : nullptr;
  for (size_t i = 0; i < f.slices.size() && !drain_; ++i) {
    copy_slice(f.slices[i], /*pack=*/true, to_servers, f.send, send_at[i], Peers::Others);
  }
  const size_t me = static_cast<size_t>(ctx_.comm->rank());
  stats_.bytes_sent += t.send_bytes - t.send_counts[me];
  stats_.bytes_received += t.recv_bytes - t.recv_counts[me];
  wire_->move(f.send, t, f.recv, /*timed=*/!drain_, f.ticket);
  for (size_t i = 0; i < f.slices.size() && !drain_; ++i) {  // this rank's own rows, while the others travel
    if (f.self_direct[i]) {
      copy_self(f.slices[i], to_servers);
    } else {
      copy_slice(f.slices[i], /*pack=*/true, to_servers, f.recv, f.recv_at[i], Peers::Self);
    }
  }
  return f;
}

void Mover::finish(InFlight& f) {
  wire_->join(f.ticket);
  const bool owner_side = f.direction == Direction::ToOwners;  // the receiving side
  for (size_t i = 0; i < f.slices.size() && !drain_; ++i) {
    if (f.kv_sums && !plan_.tables[table_of(f.slices[i].set, owner_side)].exclusive) {
      sum_kv_rows(f.recv, f.slices[i]);  // the recv buffer holds this one slice, in wire order
    } else {
      copy_slice(f.slices[i], /*pack=*/false, owner_side, f.recv, f.recv_at[i],
                 f.self_direct[i] ? Peers::Others : Peers::All);
    }
  }
  scratch_.give_back(f.send);
  scratch_.give_back(f.recv);
  f.send = f.recv = nullptr;
}

void Mover::copy_slice(const Slice& s, bool pack, bool owner_side, std::byte* buffer, const std::vector<uint64_t>& at,
                       Peers peers) {
  const Table& table = plan_.tables[table_of(s.set, owner_side)];
  const std::vector<int64_t>& rows = wire_rows(s.set, owner_side);
  const size_t me = static_cast<size_t>(ctx_.comm->rank());
  const int64_t heads = s.row_bytes / static_cast<int64_t>(sizeof(float));  // an LSE slice's
  for (size_t p = 0; p < rows.size(); ++p) {
    if ((peers == Peers::Others && p == me) || (peers == Peers::Self && p != me)) continue;
    const RowCopy* copies = (pack ? to_wire(table) : from_wire(table)) + table.peer_first[p];
    const int64_t n = table.peer_first[p + 1] - table.peer_first[p];
    const int64_t wire_row = wire_rows_before(rows, static_cast<int32_t>(p));
    std::byte* base = offset(buffer, static_cast<int64_t>(at[p]) - wire_row * s.row_bytes);
    float* wire_lse = reinterpret_cast<float*>(base);
    cudaError_t e;
    if (pack) {
      e = s.lse ? kernels::copy_strided_rows_f32(static_cast<const float*>(s.src), 1, s.src_stride, wire_lse, heads,
                                                 1, heads, copies, n, stream_)
                : kernels::copy_row_slices(s.src, s.src_stride, base, s.row_bytes, s.row_bytes, copies, n, stream_);
    } else {
      e = s.lse ? kernels::copy_strided_rows_f32(wire_lse, heads, 1, static_cast<float*>(s.dst), 1, s.dst_stride,
                                                 heads, copies, n, stream_)
                : kernels::copy_row_slices(base, s.row_bytes, s.dst, s.dst_stride, s.row_bytes, copies, n, stream_);
    }
    check_cuda(e, pack ? "pack (gather kernel)" : "unpack (scatter kernel)");
  }
}

void Mover::copy_self(const Slice& s, bool to_servers) {
  const int32_t rank = ctx_.comm->rank();
  const size_t me = static_cast<size_t>(rank);
  const Table& sender = plan_.tables[table_of(s.set, to_servers)];
  const Table& receiver = plan_.tables[table_of(s.set, !to_servers)];
  const auto wire_before = [&](bool owner_side) { return wire_rows_before(wire_rows(s.set, owner_side), rank); };
  cudaError_t e;
  if (receiver.peer_direct[me]) {
    const int64_t shift = receiver.peer_row[me] - wire_before(to_servers);
    e = kernels::copy_row_slices(s.src, s.src_stride, offset(static_cast<std::byte*>(s.dst), shift * s.dst_stride),
                                 s.dst_stride, s.row_bytes, to_wire(sender) + sender.peer_first[me],
                                 sender.peer_first[me + 1] - sender.peer_first[me], stream_);
  } else {
    const int64_t shift = sender.peer_row[me] - wire_before(!to_servers);
    e = kernels::copy_row_slices(offset(static_cast<std::byte*>(const_cast<void*>(s.src)), shift * s.src_stride),
                                 s.src_stride, s.dst, s.dst_stride, s.row_bytes,
                                 from_wire(receiver) + receiver.peer_first[me],
                                 receiver.peer_first[me + 1] - receiver.peer_first[me], stream_);
  }
  check_cuda(e, "this rank's own rows (copy kernel)");
}

void Mover::sum_kv_rows(const std::byte* recv, const Slice& s) {
  const Table& single = plan_.tables[OwnerKvSingle];
  check_cuda(kernels::copy_row_slices(recv, s.row_bytes, s.dst, s.dst_stride, s.row_bytes, to_wire(single),
                                      single.count, stream_),
             "move dK/dV");
  const int64_t n = plan_.shared_kv_rows;
  const int64_t* index = static_cast<const int64_t*>(plan_.sum_index.ptr);
  const int64_t element = plan_.bf16 ? 2 : 4;
  check_cuda(kernels::sum_rows(recv, plan_.bf16, s.row_bytes / element, index + n, index + 2 * n + 1, index, n, s.dst,
                               stream_, plan_.own_in_place, s.dst_stride / element),
             "sum dK/dV");
}

}  // namespace cad::cad_plugin
