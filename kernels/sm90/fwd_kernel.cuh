// sm90/fwd_kernel.cuh -- the Hopper (sm_90a) forward kernel: the same work items and online softmax as the
// sm80 forward, organised the way Hopper wants it (warp specialisation, as in FlashAttention-3). This
// file is the skeleton -- shared memory, barriers, the roles of the warpgroups and their walk over the
// units; each concern it calls is a file of its own:
//   sm90/fwd_traits.cuh     tile sizes, stages, register split, shared-memory map, named-barrier ids
//   sm90/fwd_scheduler.cuh  the grid, which units each persistent block runs (a fixed share or the next
//                           untaken one) and the hand-off of each unit's number to the consumers
//   sm90/fwd_mainloop.cuh   producer (TMA loads of Q and the K/V ring) and consumer (wgmma S and PV)
//   sm90/fwd_softmax.cuh    masking and the online softmax
//   sm90/fwd_epilogue.cuh   O/LSE, or the split-KV partials
//   sm90/fwd_launch.cuh     TMA descriptors, grid and launch
//
// One persistent block per SM walks (work item, query head) units; its producer picks them. Warpgroups: a
// producer (one thread issues everything) and consumers of 64 queries each, two at head dim 128, three at 64
// (sm90/fwd_traits.cuh). Register budget: setmaxnreg moves registers from the producer to the consumers
// (fwd_traits.cuh's split). Tiles sit in shared memory in
// wgmma's 128-byte-swizzled layout (atoms of 64 head-dim columns), which is what TMA writes with 128-byte
// swizzle. Compiled to a stub everywhere but sm_90a; the launcher only picks it where the sm_90a binary
// is loaded.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "attention_internal.h"
#include "common/mma_utils.cuh"
#include "sm90/arch.cuh"
#include "sm90/async.cuh"
#include "sm90/fwd_epilogue.cuh"
#include "sm90/fwd_mainloop.cuh"
#include "sm90/fwd_scheduler.cuh"
#include "sm90/fwd_softmax.cuh"
#include "sm90/fwd_traits.cuh"

namespace cad::kernels::detail {

// WINDOW: the instantiation for sliding windows (p.window_left / p.window_right; see sm90/fwd_softmax.cuh's
// fwd90_window_masks). The producer and the pipeline are the same -- the plan's items already start each query
// tile's keys at its first query's window -- only the masks differ; WINDOW = false is the unwindowed kernel,
// code unchanged.
template <int D, int STAGES, bool WINDOW = false>
__global__ void __launch_bounds__(Fwd90Traits<D, STAGES>::kThreads, 1)
    attention_fwd_sm90_kernel(const __grid_constant__ FwdParams p, const __grid_constant__ CUtensorMap tm_q,
                              const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                              int num_units) {
#ifdef CAD_SM90_KERNEL_BODY
  using T = Fwd90Traits<D, STAGES>;
  constexpr int BM = T::kBlockM, BN = T::kBlockN, S = T::kStages;
  extern __shared__ unsigned char smem_raw[];
  // Swizzle atoms must start 1024-byte aligned.
  const uint32_t raw_addr = smem_addr(smem_raw);
  const Fwd90Smem<T> sm(raw_addr + ((1024 - (raw_addr & 1023)) & 1023));
  constexpr uint32_t kConsumerWarps = T::kConsumerWarps;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    mbar_init(sm.q_full(), 1);
    mbar_init(sm.q_empty(), kConsumerWarps);
    for (int s = 0; s < S; ++s) {
      mbar_init(sm.k_full(s), 1);
      mbar_init(sm.k_empty(s), kConsumerWarps);
      mbar_init(sm.v_full(s), 1);
      mbar_init(sm.v_empty(s), kConsumerWarps);
    }
    for (int slot = 0; slot < 2; ++slot) {
      mbar_init(sm.unit_full(slot), 1);
      mbar_init(sm.unit_empty(slot), kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();

  if (warp < 4) {
    // ---- producer ----------------------------------------------------------------------------------
    registers_release<T::kProducerRegs>();
    if (warp != 0 || lane != 0) return;
    tma_prefetch_descriptor(&tm_q);
    tma_prefetch_descriptor(&tm_k);
    tma_prefetch_descriptor(&tm_v);
    int tiles_issued = 0;
    for (int units_done = 0;; ++units_done) {
      const int u = fwd90_producer_unit(p, sm, units_done, num_units);
      if (u < 0) break;
      const FwdUnit unit = fwd90_unit(p, u, num_units);
      const FwdItem item = p.items[unit.item];
      const int head = unit.head, kv_head = head / p.group;
      fwd90_load_unit<T, D>(sm, &tm_q, &tm_k, &tm_v, item, head, kv_head, units_done, tiles_issued);
    }
    return;
  }

  // ---- consumers ---------------------------------------------------------------------------------------
  registers_claim<T::kConsumerRegs>();
  // Consumer warpgroup: queries 64*cw .. 64*cw + 63 of the tile. Broadcast from lane 0, so that ptxas knows it is
  // warp-uniform and keeps what derives from it (the wgmma descriptors, the turn barrier ids) in uniform
  // registers, as the backward does: 32 fewer instructions per warp and tile at D 128, 8 at D 64, and no spills
  // at D 64; as fast as computing it per thread (record bwd_variants_h200x1_2026-12-04_84fc49f, suffix _u1).
  const int cw = __shfl_sync(0xffffffffu, warp / 4 - 1, 0);
  const int wtid = tid - 128 - cw * 128;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = cw * 64 + (warp % 4) * 16;  // this warp's first query in the tile
  const int64_t q_stride = static_cast<int64_t>(p.hq) * D;
  const bool fold_scale = p.scale_log2 > 0.f;
  const float scale_eff = fold_scale ? p.scale_log2 : 1.f;
  int tiles_used = 0, units_done = 0;  // declared before the barrier: after it, ptxas allocates differently
  if (cw == T::kConsumers - 1) named_barrier_arrive(kTurnBarrier + 0, kTurnBarrierThreads);  // consumer 0 takes the first turn
  for (int u; (u = fwd90_consumer_unit(p, sm, units_done, num_units, lane)) >= 0; ++units_done) {
    const FwdUnit unit = fwd90_unit(p, u, num_units);
    const FwdItem item = p.items[unit.item];
    const int head = unit.head;
    const int n_keys = item.kv_end - item.kv_begin;
    const int n_tiles = n_keys > 0 ? (n_keys + BN - 1) / BN : 0;
    // Masks: the causal one (fwd90_masks), or the window's, both edges (WINDOW: fwd90_window_masks, which
    // also sets key_first and mask_until; the unwindowed kernel never reads them).
    int key_limit[2], key_first[2], mask_until;
    int mask_from = WINDOW ? fwd90_window_masks<BN>(p, item, n_keys, warp_row0, g, key_limit, key_first, mask_until)
                           : fwd90_masks<BN>(p, item, n_keys, warp_row0, g, key_limit);
    if constexpr (kFwd90UniformMasks) {  // sm90/fwd_traits.cuh: warp-uniform, and now known to be
      mask_from = __shfl_sync(0xffffffffu, mask_from, 0);
      if constexpr (WINDOW) mask_until = __shfl_sync(0xffffffffu, mask_until, 0);
    }

    float o_acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};  // in the units of the (raw or pre-scaled) scores
    float row_sum[2] = {0.f, 0.f};

    auto softmax_tile = [&](float(&s)[BN / 2], int j, float(&alpha)[2]) {
      fwd90_softmax_tile<BN, WINDOW>(s, j, alpha, row_max, row_sum, key_limit, key_first, mask_from, mask_until, t, p,
                                     fold_scale, scale_eff);
    };
    fwd90_consume_unit<T, D>(sm, o_acc, softmax_tile, n_keys, n_tiles, cw, wtid, lane, units_done, tiles_used);

    fwd90_epilogue<D, BM>(p, item, head, o_acc, row_max, row_sum, scale_eff, q_stride, warp_row0, g, t);
  }
  // The last consumer arrived once more on consumer 0's turn barrier than consumer 0 waited (the first turn).
  if (cw == 0) named_barrier_sync(kTurnBarrier + 0, kTurnBarrierThreads);
#endif
}

}  // namespace cad::kernels::detail
