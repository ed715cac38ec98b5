// sm90/fwd_scheduler.cuh -- which (work item, query head) units each persistent block of the Hopper
// forward runs, and in what order: the grid (one block per SM, or fewer when there are fewer units),
// the walk over the units and the optional bands by KV head. Two walks (ForwardPlan::dynamic_walk):
//  - static: each block a fixed share, rounds of alternating direction (fwd_unit_of);
//  - dynamic: each block takes the next unit nobody has taken (an atomic counter in the workspace, zeroed
//    before the launch), so that a block that starts late -- its SM held by a kernel beside this one, a
//    collective -- takes fewer units and the grid still ends together.
// Under the dynamic walk the block's producer picks the unit and hands its number to every consumer through
// two slots in shared memory (fwd90_publish_unit / fwd90_take_unit). The work items themselves (query tiles, KV splits,
// heaviest first) come from the host plan (attention_plan.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention_internal.h"
#include "sm90/async.cuh"
#include "sm90/fwd_traits.cuh"

namespace cad::kernels::detail {

// ---- host: the grid and the walk's mode --------------------------------------------------------------
// Blocks of the persistent grid: one per SM, fewer when there are fewer units.
inline int fwd90_grid(int64_t units, int sms) { return static_cast<int>(std::min<int64_t>(units, sms)); }

// Bands of items by KV head pay where there are many items of similar size (long sequences, whose KV
// does not fit in L2 at once: Pretrain 128K buffer +5%); with few items a band holds items of every
// size and breaks the heaviest-first order that balances the blocks (dense 4K: 498 -> 300 TFLOP/s;
// the CAD mixed-shard batch of 148 items: -3%).
inline int fwd90_kv_head_bands(const FwdParams& p, int num_items, int grid) {
  const int band_items = std::max(1, grid / p.group);
  return (p.hq / p.group > 1 && num_items >= 8 * band_items) ? 1 : 0;
}

// ---- device: the walk ----------------------------------------------------------------------------------
// Unit (work item x query head) number `round` of block `block`: rounds alternate direction, so that with
// units sorted heaviest first every block gets a fair mix of heavy and light units.
__device__ __forceinline__ int fwd_unit_of(int round, int block, int blocks) {
  return round * blocks + ((round & 1) ? blocks - 1 - block : block);
}

// Work item and query head of unit u. Units go heaviest item first; within a band of items that one
// wave of blocks covers, by KV head: the blocks running at the same time then share one KV head's keys
// and values (which fit in L2) instead of streaming all KV heads at once.
struct FwdUnit {
  int item, head;
};
__device__ __forceinline__ FwdUnit fwd_unit_coords(int u, int num_items, int hq, int group, int blocks, bool by_kv_head) {
  if (!by_kv_head) return {u / hq, u % hq};
  const int band_items = max(1, blocks / group);
  const int band = u / (band_items * hq), band_first = band * band_items;
  const int items_here = min(band_items, num_items - band_first);
  const int r = u - band * band_items * hq;
  const int kv_head = r / (items_here * group), r2 = r % (items_here * group);
  return {band_first + r2 / group, kv_head * group + r2 % group};
}

// Unit u's coordinates under this launch's bands.
__device__ __forceinline__ FwdUnit fwd90_unit(const FwdParams& p, int u, int num_units) {
  return fwd_unit_coords(u, num_units / p.hq, p.hq, p.group, gridDim.x, p.kv_head_bands != 0);
}

// ---- device: the hand-off from the producer to the consumers ------------------------------------------
// Under the dynamic walk (p.unit_counter), slot k % 2 carries the block's k-th unit (or -1: the block is done).
// The producer waits until every consumer warp has read the slot's previous number (unit k - 2); the consumers
// wait for the number. The mbarrier arrive (release) and wait (acquire) order the slot's store before its loads.
// The static walk needs no hand-off: every role computes the same sequence.
template <typename T>
__device__ __forceinline__ void fwd90_publish_unit(const Fwd90Smem<T>& sm, int k, int u) {
  const int slot = k & 1;
  mbar_wait(sm.unit_empty(slot), ((k >> 1) & 1) ^ 1);
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(sm.unit_slot(slot)), "r"(u) : "memory");
  mbar_arrive(sm.unit_full(slot));
}
template <typename T>
__device__ __forceinline__ int fwd90_take_unit(const Fwd90Smem<T>& sm, int k, int lane) {
  const int slot = k & 1;
  mbar_wait(sm.unit_full(slot), (k >> 1) & 1);
  int u;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(u) : "r"(sm.unit_slot(slot)) : "memory");
  mbar_arrive_warp(sm.unit_empty(slot), lane);
  return u;
}

// The block's k-th unit, -1 when it has none left: the producer's (under the dynamic walk it takes the next
// untaken unit of the grid and hands it on) and the consumers'.
__device__ __forceinline__ int fwd90_static_unit(int k, int num_units) {
  const int u = fwd_unit_of(k, blockIdx.x, gridDim.x);
  return u < num_units ? u : -1;
}
template <typename T>
__device__ __forceinline__ int fwd90_producer_unit(const FwdParams& p, const Fwd90Smem<T>& sm, int k, int num_units) {
  if (p.unit_counter == nullptr) return fwd90_static_unit(k, num_units);
  int u = atomicAdd(p.unit_counter, 1);
  if (u >= num_units) u = -1;
  fwd90_publish_unit(sm, k, u);
  return u;
}
template <typename T>
__device__ __forceinline__ int fwd90_consumer_unit(const FwdParams& p, const Fwd90Smem<T>& sm, int k, int num_units,
                                                   int lane) {
  return p.unit_counter == nullptr ? fwd90_static_unit(k, num_units) : fwd90_take_unit(sm, k, lane);
}

}  // namespace cad::kernels::detail
