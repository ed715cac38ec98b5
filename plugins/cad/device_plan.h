// device_plan.h -- DESIGN.md's step 2 on the GPU (CUDA builds only): a plan's layout (layout.h) as the index
// tables the copy kernels read (wire_tables.h), uploaded once per plan, with the rows each peer sends and receives
// and the sizes of the per-call buffers. make_device_plan / release_device_plan are declared in device_path.h.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "device_memory.h"
#include "wire_tables.h"

namespace cad::cad_plugin {

// One index table (wire_tables.h) in the plan's device arrays.
struct Table {
  int64_t offset = 0;  // first entry in the plan's device table arrays
  int64_t count = 0;
  std::vector<int64_t> peer_row;    // per peer: its first row (wire_tables.h)
  std::vector<bool> peer_direct;    // per peer: its rows are one contiguous range, from peer_row
  bool exclusive = false;           // owner KV: dK/dV rows come back from one server each (no sum)
  std::vector<int64_t> peer_first;  // per peer: first entry, relative to offset (world + 1 entries)
};

enum TableId {
  OwnerQ, OwnerKv, ServerQ, ServerKv,
  OwnerKvSingle,  // owner-side dK/dV rows read by one server: moved (the others are summed, wire_tables.h)
  kNumTables
};

struct DevicePlan {
  int device = 0;
  void* stream = nullptr;  // the allocation stream (resources go back on it)
  // Per table, two directions of the same pairs: "to_wire" (tensor row -> wire row) and "from_wire".
  Table tables[kNumTables];
  DeviceBuffer to_wire, from_wire;  // RowCopy arrays, one per direction, tables at their offsets
  // Rows on the wire per peer: owner side (to / from each server) and server side (from / to each owner).
  std::vector<int64_t> owner_q_rows, owner_kv_rows, server_q_rows, server_kv_rows;
  void* pinned_send = nullptr;         // host-staged mode only: staged_bytes each
  void* pinned_recv = nullptr;
  size_t staged_bytes = 0;             // the largest exchange's bytes (it moves several tensors)
  WorkspaceSizes sizes;                // of the per-call buffers (CallScratch)
  DeviceBuffer sum_index;  // owner-side dK/dV rows read by several servers (wire_tables.h: shared_*)
  int64_t shared_kv_rows = 0;
  bool own_in_place = false;  // this rank runs tasks in place (layout.own): returning dK/dV rows are added
  // The server batch runs a head group at a time, its rows moving group by group (device_path.h): laid out group
  // after group, [G][rows][H/G][D] (its LSE [G][H/G][rows], i.e. [H][rows] as ungrouped).
  int32_t head_groups = 1;
  bool bf16 = false;  // the calls' dtype (else fp32): the dK/dV sums' element
  // The tables are uploaded in the order of the plan's stream through the runtime's pinned staging, without
  // waiting on the host (a plan made ahead on another thread must not wait for the training stream to drain,
  // and it holds the instance's lock while it uploads); `ready` marks the uploads' end for calls on other
  // streams.
  cudaEvent_t ready = nullptr;

  // Every device buffer the plan holds (allocated, counted and released through this one list). The wire
  // staging and the server batch's scratch are not here: a call takes them from the host's allocator and
  // gives them back when it ends (CallScratch), so a plan made ahead, or one of two ping-pong plans, holds
  // no more than its index tables, and between calls the memory serves the application.
  std::array<DeviceBuffer*, 3> buffers() { return {&to_wire, &from_wire, &sum_index}; }
};

// A call on another stream than the plan's waits for the plan's uploads (on the GPU, not the host).
void wait_for_tables(const DevicePlan& plan, cudaStream_t stream);

}  // namespace cad::cad_plugin
