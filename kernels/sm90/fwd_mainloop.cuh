// sm90/fwd_mainloop.cuh -- the Hopper forward's pipeline for one unit (work item x query head), both
// sides of it:
//  - producer (one thread): Q, then the unit's K/V tiles into a ring of kStages stages with TMA, each
//    stage guarded by a pair of mbarriers (full: bytes landed; empty: every consumer done with it);
//  - consumer (one warpgroup of 64 queries): per KV tile j, S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued
//    as two wgmma groups, then the softmax of S_j (sm90/fwd_softmax.cuh) while the PV product runs. The
//    consumers take turns to issue (named barriers), so one's softmax overlaps the others' products.
// The unit order is sm90/fwd_scheduler.cuh's; the output is written by sm90/fwd_epilogue.cuh.
#pragma once

#include <cstdint>

#include "attention_internal.h"
#include "sm90/async.cuh"
#include "sm90/fwd_softmax.cuh"
#include "sm90/fwd_traits.cuh"
#include "sm90/wgmma.cuh"

namespace cad::kernels::detail {

// ---- producer ------------------------------------------------------------------------------------------
// Loads Q and every K/V tile of one unit. `units_done` counts this block's earlier units (the Q stage's
// phase), `tiles_issued` its earlier K/V tiles (the ring's position and phase).
template <typename T, int D>
__device__ __forceinline__ void fwd90_load_unit(const Fwd90Smem<T>& sm, const CUtensorMap* tm_q, const CUtensorMap* tm_k,
                                                const CUtensorMap* tm_v, const FwdItem& item, int head, int kv_head,
                                                int units_done, int& tiles_issued) {
  constexpr int BM = T::kBlockM, BN = T::kBlockN, S = T::kStages;
  mbar_wait(sm.q_empty(), (units_done & 1) ^ 1);
  mbar_arrive_expect_tx(sm.q_full(), T::kQBytes);
#pragma unroll
  for (int a = 0; a < D / 64; ++a) tma_load_3d(sm.q + a * BM * 128, tm_q, a * 64, head, int(item.q_row), sm.q_full());
  const int n_keys = item.kv_end - item.kv_begin;
  const int n_tiles = n_keys > 0 ? (n_keys + BN - 1) / BN : 0;
  const int row0 = int(item.kv_row + item.kv_begin);
  for (int j = 0; j < n_tiles; ++j, ++tiles_issued) {
    const int s = tiles_issued % S;
    const uint32_t parity = ((tiles_issued / S) & 1) ^ 1;
    mbar_wait(sm.k_empty(s), parity);
    mbar_arrive_expect_tx(sm.k_full(s), T::kTileBytes);
#pragma unroll
    for (int a = 0; a < D / 64; ++a)
      tma_load_3d(sm.k_tile(s) + a * BN * 128, tm_k, a * 64, kv_head, row0 + j * BN, sm.k_full(s));
    mbar_wait(sm.v_empty(s), parity);
    mbar_arrive_expect_tx(sm.v_full(s), T::kTileBytes);
#pragma unroll
    for (int a = 0; a < D / 64; ++a)
      tma_load_3d(sm.v_tile(s) + a * BN * 128, tm_v, a * 64, kv_head, row0 + j * BN, sm.v_full(s));
  }
}

// ---- consumer ------------------------------------------------------------------------------------------
// A stage (or Q) is released once every lane of a warp is done with it (mbar_arrive_warp).

// S = Q K^T for one K stage (consumer cw's 64 queries x BN keys), one wgmma group.
template <typename T, int D>
__device__ __forceinline__ void fwd90_issue_qk(float (&s)[T::kBlockN / 2], const Fwd90Smem<T>& sm, int cw, int stage) {
  constexpr int BM = T::kBlockM, BN = T::kBlockN;
  // Descriptors rebuilt per product, not moved by one add as the backward's (sm90/wgmma.cuh's SmemTileDesc says why).
  const uint32_t q_addr = sm.q + cw * 64 * 128, k_addr = sm.k_tile(stage);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t col_bytes = (kk & 3) * 32;
    const uint64_t da = smem_desc_sw128(q_addr + (kk >> 2) * BM * 128 + col_bytes, 0, 1024),
                   db = smem_desc_sw128(k_addr + (kk >> 2) * BN * 128 + col_bytes, 0, 1024);
    if (kk == 0) {
      wgmma_m64n128k16_ss_first(s, da, db);
    } else {
      wgmma_m64n128k16_ss(s, da, db, 1);
    }
  }
  wgmma_commit();
}

// O += P V for one V stage: P from registers (16 keys per step), V as the transposed operand; one group.
template <typename T, int D>
__device__ __forceinline__ void fwd90_issue_pv(float (&o)[D / 2], const uint32_t (&pa)[T::kBlockN / 16][4],
                                               const Fwd90Smem<T>& sm, int stage) {
  constexpr int BN = T::kBlockN;
  const uint32_t v_addr = sm.v_tile(stage);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    // 16 keys = two 8-row groups (stride 1024 B); the next 64 head-dim columns are one atom (BN rows) on.
    const uint64_t db = smem_desc_sw128(v_addr + kk * 16 * 128, BN * 128, 1024);
    if constexpr (D == 128) {
      wgmma_m64n128k16_rs_tb(o, pa[kk], db, 1);
    } else {
      wgmma_m64n64k16_rs_tb(o, pa[kk], db, 1);
    }
  }
  wgmma_commit();
}

// One unit of consumer warpgroup cw (thread wtid of it): every K/V tile of the unit through S, the softmax
// step (softmax_tile(s, j, alpha): sm90/fwd_softmax.cuh, with the unit's masks and row statistics) and PV
// into o_acc (zeroed by the caller); Q is handed back once the unit's last S product and its softmax are done.
// `tiles_used` counts this block's earlier K/V tiles, as the producer's `tiles_issued` does. (units_done by
// reference and the softmax as the caller's lambda: passed as values, the compiler numbers the loop's
// registers differently and ptxas allocates them differently; this split of the kernel into files left the
// SASS unchanged.)
template <typename T, int D, typename SoftmaxTile>
__device__ __forceinline__ void fwd90_consume_unit(const Fwd90Smem<T>& sm, float (&o_acc)[D / 2],
                                                   SoftmaxTile& softmax_tile, int n_keys, int n_tiles, int cw, int wtid,
                                                   int lane, const int& units_done, int& tiles_used) {
  constexpr int BN = T::kBlockN, S = T::kStages;
  mbar_wait(sm.q_full(), units_done & 1);
  if (n_tiles > 0) {
    float s[BN / 2];
    uint32_t pa[BN / 16][4];
    float alpha[2];
    // Tile 0: S only (there is no P yet).
    int stage = tiles_used % S;
    mbar_wait(sm.k_full(stage), (tiles_used / S) & 1);
    named_barrier_sync(kTurnBarrier + cw, kTurnBarrierThreads);
    wgmma_fence();
    fwd90_issue_qk<T, D>(s, sm, cw, stage);
    named_barrier_arrive(kTurnBarrier + (cw + 1) % T::kConsumers, kTurnBarrierThreads);
    wgmma_wait<0>();
    fence_registers(s);
    mbar_arrive_warp(sm.k_empty(stage), lane);
    if (n_tiles == 1) mbar_arrive_warp(sm.q_empty(), lane);  // the unit's last S: Q is free (see the loop)
    softmax_tile(s, 0, alpha);
    accumulator_to_a_fragments(s, pa);
    // Tile j: S_j and O += P_{j-1} V_{j-1} in flight together; softmax of S_j under the PV product.
    for (int j = 1; j < n_tiles; ++j) {
      // The ring position from the tile count, per tile: carried from tile to tile instead (an add and a
      // branch), the D 128 forward lost up to 7% (git history: f6a60bf; record fwd_variants_h200x1_2026-12-04_f6a60bf).
      const int prev = stage, prev_parity = ((tiles_used + j - 1) / S) & 1;
      stage = (tiles_used + j) % S;
      mbar_wait(sm.k_full(stage), ((tiles_used + j) / S) & 1);
      mbar_wait(sm.v_full(prev), prev_parity);
      named_barrier_sync(kTurnBarrier + cw, kTurnBarrierThreads);
      wgmma_fence();
      fwd90_issue_qk<T, D>(s, sm, cw, stage);
      fwd90_issue_pv<T, D>(o_acc, pa, sm, prev);
      named_barrier_arrive(kTurnBarrier + (cw + 1) % T::kConsumers, kTurnBarrierThreads);
      wgmma_wait<1>();
      fence_registers(s);
      mbar_arrive_warp(sm.k_empty(stage), lane);
      softmax_tile(s, j, alpha);
      // The unit's last S is done: Q goes back, so the producer loads the next unit's Q (and then its first
      // K/V tiles) under the last PV product and the epilogue. After the softmax, not before it: with the
      // arrive above the softmax, ptxas placed the wait for PV(j-1) right behind S(j)'s wait, above the whole
      // softmax (no exp ran under PV; that wait drew 10.9% of the stall samples in record
      // ncu_hotspots_h200x1_2026-12-02_5324b43); here all of the softmax sits under PV, and the forward ran
      // 1.01-1.04x faster (bench/results/bwd_variants_h200x1_2026-12-04_84fc49f, suffix _w1).
      if (j == n_tiles - 1) mbar_arrive_warp(sm.q_empty(), lane);
      wgmma_wait<0>();
      fence_registers(o_acc);
      mbar_arrive_warp(sm.v_empty(prev), lane);
      fwd90_rescale_o(o_acc, alpha);
      accumulator_to_a_fragments(s, pa);
    }
    // Last PV product. Key rows past the segment's end in the last tile were loaded from whatever follows
    // in memory; P is 0 there, but 0 * (Inf or NaN) is not, so they are zeroed first.
    const int last = (tiles_used + n_tiles - 1);
    mbar_wait(sm.v_full(stage), (last / S) & 1);
    const int valid_rows = n_keys - (n_tiles - 1) * BN;
    if (valid_rows < BN) {
      const uint32_t v_addr = sm.v_tile(stage);
      const int chunks = (BN - valid_rows) * (D / 8);  // 16-byte chunks (a row = D/64 atoms of 128 B)
      for (int c = wtid; c < chunks; c += 128) {
        const int row = valid_rows + c / (D / 8), col_chunk = c % (D / 8);
        const uint32_t addr = v_addr + (col_chunk / 8) * BN * 128 + row * 128 + (col_chunk % 8) * 16;
        asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
      }
      fence_proxy_async_smem();
      named_barrier_sync(kWarpgroupBarrier + cw, 128);
    }
    wgmma_fence();
    fwd90_issue_pv<T, D>(o_acc, pa, sm, stage);
    wgmma_wait<0>();
    fence_registers(o_acc);
    mbar_arrive_warp(sm.v_empty(stage), lane);
    tiles_used += n_tiles;
  } else {
    mbar_arrive_warp(sm.q_empty(), lane);  // no keys: Q was never read
  }
}

}  // namespace cad::kernels::detail
