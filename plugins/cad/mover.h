// mover.h -- the CUDA data path's exchange engine (CUDA builds only): one call's view of its plan's index tables
// (device_plan.h), packing each exchange's rows per peer with the copy kernels (pack.h), moving them over the
// call's wire (wire_device.h: NCCL, or staged through pinned host memory) and unpacking them into the receiving
// tensors. The rows a rank sends itself never travel (device_path.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "device_plan.h"
#include "pack.h"
#include "wire.h"

namespace cad::cad_plugin {

// One call's view of the plan: the exchange primitives over its tables and buffers.
class Mover {
 public:
  using RowCopy = kernels::RowCopy;
  Mover(CadContext& ctx, DevicePlan& plan, CallScratch& scratch, cudaStream_t stream, bool drain, CallStats& stats);
  Mover(const Mover&) = delete;
  Mover& operator=(const Mover&) = delete;
  // After a failure: the exchanges still run (the peers wait for them), nothing more is packed or unpacked.
  void stop_writing() { drain_ = true; }

  // One tensor's share of an exchange started with start(): `row_bytes` bytes of each row, rows `src_stride` /
  // `dst_stride` bytes apart -- whole rows (all three equal), or a head group's (DevicePlan::head_groups:
  // a slice of the owner's full rows, the server batch's group rows whole). An LSE slice (`lse`) is a group's heads
  // of [H, rows] fp32 instead: src / dst at its first head, row_bytes = heads * 4, and the strides are the two
  // tensors' row counts (their head strides).
  struct Slice {
    RunSet set;
    const void* src;
    void* dst;
    int64_t row_bytes;
    int64_t src_stride, dst_stride;
    bool lse = false;
  };
  // An exchange enqueued on the communication stream and joined to the caller's stream only by finish(): the
  // caller enqueues other work (the server batch's previous head group) in between.
  struct InFlight {
    Direction direction = Direction::ToServers;
    std::vector<Slice> slices;
    bool kv_sums = false;  // one dK or dV slice to its owners: a row read by one server moved, by several summed
    std::byte* send = nullptr;
    std::byte* recv = nullptr;
    std::vector<std::vector<uint64_t>> recv_at;  // per slice and peer: where its rows start in `recv`
    std::vector<bool> self_direct;               // per slice: this rank's own rows copied by start() (no buffer)
    WireTicket ticket;  // the move's, until finish() joins it
  };

  // Packs the slices' rows for the other ranks into one send buffer (per peer: each slice's rows in turn,
  // place_wire_parts) and enqueues their all_to_all_v; the receiving side is unpacked by finish(). The rows a rank
  // sends itself never travel: beside the collective they are copied from the source tensor straight into the
  // destination where one side holds them as one range (`self_direct`), else (LSE, summed dK/dV) packed into the
  // receive buffer's place for them and unpacked with the rest.
  InFlight start(Direction direction, std::vector<Slice> slices, bool kv_sums = false);

  // Joins `f` to the caller's stream, unpacks its slices into their tensors and gives its buffers back.
  void finish(InFlight& f);

 private:
  // One slice's rows between its tensor and an exchange buffer, peer by peer: `pack` (s.src -> buffer, with the
  // sending side's table) or unpack (buffer -> s.dst, with the receiving side's); `owner_side`: that side is the
  // owners'. A table's copies for peer p address the slice's own wire rows, which start after the rows of the peers
  // before p, so the buffer shifted back by those puts them at the slice's place in p's range (`at[p]`).
  enum class Peers { All, Others, Self };  // which peers' rows copy_slice copies (Self: this rank's own)
  void copy_slice(const Slice& s, bool pack, bool owner_side, std::byte* buffer, const std::vector<uint64_t>& at,
                  Peers peers);

  // Can a slice's rows for this rank itself go straight from its source tensor to its destination? Where the
  // receiving side holds them as one range (packed into it with the sending side's table) or the sending side
  // does (unpacked from it with the receiving side's); not an LSE (a strided copy) nor dK/dV the owner sums.
  bool self_direct(const Slice& s, bool to_servers, bool kv_sums) const {
    const size_t me = static_cast<size_t>(ctx_.comm->rank());
    if (s.lse || (kv_sums && !plan_.tables[OwnerKv].exclusive)) return false;
    return plan_.tables[table_of(s.set, !to_servers)].peer_direct[me] ||
           plan_.tables[table_of(s.set, to_servers)].peer_direct[me];
  }
  // The self_direct copy of a slice's own rows (the table's copies address wire rows: the range's start is
  // shifted back by the wire rows of the peers before this rank, as copy_slice does with a buffer).
  void copy_self(const Slice& s, bool to_servers);

  // The table of one side of an exchange: the owners' (to their servers, or back to them) or the server's.
  static TableId table_of(RunSet set, bool owner_side) {
    const bool q = set == RunSet::Q;
    return owner_side ? (q ? OwnerQ : OwnerKv) : (q ? ServerQ : ServerKv);
  }
  const std::vector<int64_t>& wire_rows(RunSet set, bool owner_side) const {
    const bool q = set == RunSet::Q;
    return owner_side ? (q ? plan_.owner_q_rows : plan_.owner_kv_rows) : (q ? plan_.server_q_rows : plan_.server_kv_rows);
  }

  // The key/value owner's side of partial dK or dV in `recv` (wire order): the rows read by one server moved, the
  // rows read by several summed in fp32, peer after peer in rank order (bitwise reproducible), into `s.dst` with
  // rows `s.dst_stride` bytes apart.
  void sum_kv_rows(const std::byte* recv, const Slice& s);

  static std::byte* offset(std::byte* buffer, int64_t bytes) {
    return reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(buffer) + static_cast<uintptr_t>(bytes));
  }
  const RowCopy* to_wire(const Table& t) const { return static_cast<const RowCopy*>(plan_.to_wire.ptr) + t.offset; }
  const RowCopy* from_wire(const Table& t) const { return static_cast<const RowCopy*>(plan_.from_wire.ptr) + t.offset; }

  CadContext& ctx_;
  DevicePlan& plan_;
  CallScratch& scratch_;
  cudaStream_t stream_;
  bool drain_;
  CallStats& stats_;
  std::unique_ptr<Wire> wire_;  // the call's: NCCL or host-staged (wire_device.h)
};

}  // namespace cad::cad_plugin
