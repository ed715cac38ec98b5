// sm90/bwd_kernel.cuh -- the Hopper (sm_90a) backward kernel, head dims 64 and 128: the work items and
// math of the portable backward (sm80/bwd_kernel.cuh) with all five matrix products on wgmma,
// warp-specialised like FlashAttention-3 (a TMA producer warp, mbarrier stages, dQ through shared memory and
// TMA reductions). This file is the skeleton -- shared memory, barriers, the warp roles and the consumer's
// step; the concerns it calls are files of their own:
//   sm90/bwd_traits.cuh     tile sizes, stages, register split, shared-memory map, named-barrier ids
//   sm90/bwd_scheduler.cuh  block -> (work item, KV head)
//   sm90/bwd_mainloop.cuh   producer (TMA loads of Q/dO, LSE/Delta) and the consumer's wgmma products
//   sm90/bwd_softmax.cuh    P^T (masked or not) and dS^T
//   sm90/bwd_epilogue.cuh   dQ (shared buffers, the dQ writer's TMA reductions) and dK/dV
//   sm90/bwd_launch.cuh     TMA descriptors, grid and launch
// Compiled to a stub everywhere but sm_90a; the launcher only picks it where the sm_90a binary is loaded.
//
// One block = 128 keys (kBwdBlockN90) of one work item x one KV head: two math warpgroups of 64 keys, each
// keeping its dK/dV (64 x D fp32) in registers. Per step of BM queries (64 at D=128; 128 at D=64, as
// FlashAttention-3/4 tile it there, or 64 with -DCAD_BWD64_QUERIES=64):
//   S^T = K Q^T, dP^T = V dO^T          (shared x shared; 64 keys x BM queries per warpgroup)
//   dV += P^T dO, dK += dS^T Q          (P^T / dS^T from registers, dO / Q transposed from shared)
//   dQ = dS K                           (dS^T through shared memory), a 64 x 64 fp32 tile per warpgroup:
//     D=128:             warpgroup w computes columns 64w..64w+63 over all 128 keys (it reads the other's dS^T);
//     D=64, 128 queries: warpgroup w computes queries 64w..64w+63 over all 128 keys (the same);
//     D=64, 64 queries:  warpgroup w computes all 64 columns over its own 64 keys, and both partials are
//                        added to the accumulator (the reductions are atomic per element), so the
//                        warpgroups never wait for each other.
//
// The consumer's step has two compile-time schedules (CAD_BWD90_VARIANT, sm90/bwd_traits.cuh): 1 (the default)
// gives each consumer warpgroup a dQ writer warp and barriers of its own, 0 shares one of each between them; both
// carry dQ(j) into step j+1 (issued with S(j+1)).
//
// The roles of the 384 threads of a block (one block per SM):
//  - warpgroup 0 gives its registers up (setmaxnreg) and hosts two helper warps:
//      warp 0 ("producer"): per step, TMA loads of the Q and dO tiles (BM queries, 128-byte swizzle) into a
//      ring of kStages stages, and LSE/Delta of those queries into shared memory (plain loads by its 32
//      lanes); each stage has a full mbarrier (bytes + 32 lanes) and an "empty" named barrier (the consumers
//      arrive when they are done with the stage, the producer syncs on it before refilling). A named
//      barrier, not an mbarrier, because the LSE/Delta it recycles are written with ordinary stores and
//      compute-sanitizer's racecheck follows bar.arrive/bar.sync but not mbarriers (it reported every
//      reuse of those buffers as a hazard while empty was an mbarrier);
//      warp 1 ("dQ writer"): adds each step's dQ tile (fp32, in shared memory) to the global accumulator
//      with TMA reductions (cp.reduce.async.bulk.tensor add), instead of per-thread atomics;
//  - warpgroups 1 and 2 (consumers, 240 registers) own 64 keys each, keep their dK/dV in registers, and per
//    step compute S^T, dP^T, P^T, dS^T, dV += P^T dO, dK += dS^T Q and a 64 x 64 fp32 tile of dQ = dS K
//    (see the top of the file). The consumers wait for each other's dS^T of the step before (an mbarrier
//    per dS^T buffer, see the consumer loop), except at D=64 with 64-query steps, where each waits only for
//    its own four warps. dS^T (and, where they fit, dQ) are double-buffered in shared memory, so the two
//    drift out of phase and one's elementwise work overlaps the other's products.
// K and V are loaded once per block by the consumers (cp.async, rows past the tile's keys zero-filled; the
// first step waits for K before S^T and for V only before dP^T). Rows of Q/dO past the segment's end (a
// partial last query tile) come from whatever follows in memory and are zeroed in shared memory before
// use, so that 0 * (garbage) cannot reach dK/dV; their dQ rows are then exactly 0 and the reduction adds
// nothing to the rows it touches past the segment.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention_internal.h"
#include "common/mma_utils.cuh"
#include "sm90/arch.cuh"
#include "sm90/async.cuh"
#include "sm90/bwd_epilogue.cuh"
#include "sm90/bwd_mainloop.cuh"
#include "sm90/bwd_scheduler.cuh"
#include "sm90/bwd_softmax.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/tiles.cuh"
#include "sm90/wgmma.cuh"

namespace cad::kernels::detail {

// WINDOW: the instantiation for sliding windows (p.window_left / p.window_right): the item's queries end at
// q_end (the plan's last query whose window reaches the tile) instead of the segment's end, and a step whose
// queries' windows cut through the warp's keys is masked (bwd90_probabilities_masked<BM, true>). WINDOW = false
// is the unwindowed kernel, code unchanged.
template <int DIM, int STAGES, bool WINDOW = false>
__global__ void __launch_bounds__(BwdWsTraits<DIM, STAGES>::kThreads, 1)
    attention_bwd_sm90_ws_kernel(const __grid_constant__ BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                                 const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_dq,
                                 const __grid_constant__ CUtensorMap tm_lse, const __grid_constant__ CUtensorMap tm_delta,
                                 int num_items, int heads_inner) {
#ifdef CAD_SM90_KERNEL_BODY
  using T = BwdWsTraits<DIM, STAGES>;
  constexpr int D = T::kD, BM = T::kBlockM, BN = T::kBlockN, S = T::kStages;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = (1024 - (raw_addr & 1023)) & 1023;
  unsigned char* base = smem_raw + pad;
  const uint32_t s_base = raw_addr + pad;
  const uint32_t k_addr = s_base + T::kKOff, q_addr = s_base + T::kQOff, do_addr = s_base + T::kDOOff,
                 v_addr = s_base + T::kVOff, ds_addr = s_base + T::kDSOff, dq_addr = s_base + T::kDQOff;
  float* sLse = reinterpret_cast<float*>(base + T::kLseOff);  // S x BM, base-2 units
  float* sDelta = reinterpret_cast<float*>(base + T::kDeltaOff);
  const uint32_t bars = s_base + T::kBarOff;
  auto full_bar = [&](int s) { return bars + 8 * s; };
  // dS^T buffer b written: by all 8 consumer warps, or by warpgroup wg's four (kDQOwnKeys).
  auto ds_bar = [&](int b, int wg) { return bars + 8 * (S + (T::kDQOwnKeys ? 2 * b + wg : b)); };

  const BwdUnit unit = bwd_unit(p, num_items, heads_inner);
  const BwdItem item = p.items[unit.item];
  const int kv_head = unit.kv_head;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q_span = (WINDOW ? item.q_end : item.q_len) - item.q_begin;  // unwindowed plans: q_end = q_len
  const int n_qt = q_span > 0 ? (q_span + BM - 1) / BM : 0;
  const int n_iter = n_qt * p.group;

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full_bar(s), 1);  // the producer's expect_tx arrival; Q, dO, LSE and Delta come by TMA
    }
    for (int b = 0; b < T::kDSBarriers; ++b) mbar_init(bars + 8 * (S + b), T::kDQOwnKeys ? 4 : 8);
    mbar_fence_init();
  }
  __syncthreads();

  if (warp < 4) {
    registers_release<T::kProducerRegs>();
    if (warp == 0) {
      bwd90_producer<T>(p, item, kv_head, &tm_q, &tm_do, &tm_lse, &tm_delta, q_addr, do_addr, bars,
                        s_base + T::kLseOff, s_base + T::kDeltaOff, n_qt, n_iter, lane);
    } else if (warp == 1 || (kBwdDQPerWarpgroup && warp == 2)) {  // warp 1 + wg writes warpgroup wg's dQ boxes
      bwd90_dq_writer<T>(p, item, kv_head, &tm_dq, dq_addr, n_qt, n_iter, lane, warp - 1);
    }
    return;
  }

  // ---- consumers ----
  // Per step j a consumer issues dQ(j-1) (once both warpgroups' dS^T(j-1) are in shared memory) and S(j),
  // dP(j) as one burst, stores dQ(j-1) while S/dP run, computes P and dS(j), then issues dV/dK(j). No
  // consumer waits for the other except for its dS^T of the step before, so the two may drift apart by up
  // to about half a step and overlap one's elementwise work with the other's products.
  registers_claim<T::kConsumerRegs>();
  const int ctid = tid - 128;   // 0..255
  // Broadcast from lane 0, so that the compiler knows them warp-uniform and keeps what derives from them (the
  // wgmma descriptors' start addresses) in uniform registers instead of moving it there before every product.
  const int wg = __shfl_sync(0xffffffffu, ctid / 128, 0);    // this warpgroup's keys: 64*wg .. 64*wg + 63 of the tile
  const int cwarp = __shfl_sync(0xffffffffu, ctid / 32, 0);  // 0..7
  const int g = lane / 4, t = lane % 4;
  const int key_local = cwarp * 16 + g;  // this thread's keys: key_local and key_local + 8

  const int64_t kv_stride = static_cast<int64_t>(p.hq / p.group) * D;
  const int64_t key_row0 = item.kv_row + item.kv_begin;
  // K and V in two groups: the first step's S^T = K Q^T needs only K, so V's load runs under it (the
  // first step waits for V before dP^T = V dO^T).
  load_tile_atoms_async<BN, D, 256>(reinterpret_cast<__nv_bfloat16*>(base + T::kKOff),
                                    p.k + key_row0 * kv_stride + kv_head * D, kv_stride, item.kv_rows, ctid);
  cp_async_commit();
  load_tile_atoms_async<BN, D, 256>(reinterpret_cast<__nv_bfloat16*>(base + T::kVOff),
                                    p.v + key_row0 * kv_stride + kv_head * D, kv_stride, item.kv_rows, ctid);
  cp_async_commit();
  cp_async_wait<1>();
  fence_proxy_async_smem();
  named_barrier_sync(kBwdBarConsumers, 256);

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  // This warp's keys (16 of them) need no mask in a step whose first query sees them all (causal) and
  // whose queries all lie inside the segment.
  const int warp_key_last = item.kv_begin + cwarp * 16 + 15;
  const bool warp_keys_full = cwarp * 16 + 15 < item.kv_rows;

  // dQ(j) = dS(j) K: this warpgroup's first key step, K atom and dS^T atom (see bwd90_issue_dq).
  const int dq_key_step0 = T::kDQOwnKeys ? 4 * wg : 0;
  const uint32_t dq_k_atom = D == 128 ? wg * BN * 128 : 0;
  const uint32_t dq_ds_atom = T::kDQRowHalves ? wg * BN * 128 : 0;
  const uint32_t ds_lane_addr = ds_addr + bwd90_ds_lane_offset(cwarp, lane);  // this lane's dS^T rows, buffer 0

  // Q, dO, LSE, Delta of step j's stage are no longer needed (arrive only where the producer will wait).
  auto release_stage = [&](const int j) {
    if (j + S < n_iter) named_barrier_arrive(kBwdBarStageEmpty + j % S, kBwdStageBarThreads);
  };

  // Step `it`; kPrev: there is a dQ(it-1) to issue and store (a compile-time flag, so that the compiler
  // sees one straight pipeline of wgmma groups per instance).
  // qt, hg: the step's query tile and head within the group (it = hg * n_qt + qt), counted by the caller (the
  // division it / n_qt cost about 40 instructions per step).
  auto step = [&](const int it, const int qt, const int hg, auto has_prev) {
    constexpr bool kPrev = decltype(has_prev)::value;
    const int s = it % S, b = it & 1;
    const int q0 = item.q_begin + qt * BM;
    const int h = kv_head * p.group + hg;
    const uint32_t q_buf = q_addr + s * T::kQBytes, do_buf = do_addr + s * T::kQBytes;
    // The stage holds the statistics from the 16-byte boundary at or before this tile's first row.
    const int shift = bwd90_stat_shift(p, item, h, q0);
    const float* lse_tile = sLse + s * (T::kStatBytes / 4) + shift;
    const float* delta_tile = sDelta + s * (T::kStatBytes / 4) + shift;
    [[maybe_unused]] float dq[32];  // dQ(it-1), carried into this step
    if constexpr (kPrev) {
      mbar_wait(ds_bar(b ^ 1, wg), ((it - 1) >> 1) & 1);  // dS^T(it-1): both warpgroups', or its own (kDQOwnKeys)
#pragma unroll
      for (int i = 0; i < 32; ++i) dq[i] = 0.f;
      wgmma_fence();
      bwd90_issue_dq<T>(dq, ds_addr, k_addr, dq_k_atom, dq_ds_atom, dq_key_step0, it - 1);
    }
    mbar_wait(full_bar(s), (it / S) & 1);
    const int valid_q = item.q_len - q0;
    if (valid_q < BM) {
      bwd90_zero_rows_past_end<T>(q_buf, do_buf, valid_q, ctid);
      named_barrier_sync(kBwdBarConsumers, 256);
    }

    // S^T = K Q^T (one group, in flight with dQ(it-1)), then dQ(it-1) to shared memory, then dP^T = V dO^T
    // (in flight during the softmax): this warpgroup's 64 keys x BM queries. (dQ, S and dP together in
    // registers next to dK/dV would not fit.)
    float st[BM / 2], dpt[BM / 2];
    bwd90_issue_keys_x_queries<T>(st, k_addr, q_buf, wg);
    if constexpr (kPrev) {
      wgmma_wait<1>();
      fence_registers(dq);
      bwd90_store_dq<T>(dq, dq_addr, it - 1, cwarp, wg, g, t);
    }
    if constexpr (!kPrev) {  // the first step: V's copies (every consumer thread's) land before dP^T
      cp_async_wait<0>();
      fence_proxy_async_smem();
      named_barrier_sync(kBwdBarConsumers, 256);
    }
    bwd90_issue_keys_x_queries<T>(dpt, v_addr, do_buf, wg);
    wgmma_wait<1>();
    fence_registers(st);

    // P^T (0 outside the segment and above the causal diagonal), while dP^T is still in flight: masked where
    // some of that cuts through this warp's scores (need_mask), plain (no test per score) elsewhere.
    bool need_mask = !warp_keys_full || valid_q < BM || (p.causal && warp_key_last > q0 + item.causal_offset);
    if constexpr (WINDOW) {
      // ... and outside the window: some key of the warp left of the last query's window, or right of the
      // first query's (the queries past q_end, in this step's last tile, see none of the keys: the left edge).
      const int warp_key_first = warp_key_last - 15;
      const bool cut = (p.window_left >= 0 && int64_t{warp_key_first} < int64_t{q0} + BM - 1 + item.causal_offset -
                                                                             p.window_left) ||
                       (p.window_right >= 0 && int64_t{warp_key_last} > int64_t{q0} + item.causal_offset +
                                                                            p.window_right);
      need_mask = need_mask || cut;
    }
    if (need_mask) {
      bwd90_probabilities_masked<BM, WINDOW>(st, p, item, key_local, t, q0, lse_tile);
    } else {
      bwd90_probabilities_plain<BM>(st, p, t, lse_tile);
    }
    wgmma_wait<0>();
    fence_registers(dpt);
    // dS^T = P^T (dP^T - Delta); P^T and dS^T as A fragments, dS^T also to shared memory for dQ.
    if (valid_q < BM) {
      bwd90_ds<BM, true>(dpt, st, delta_tile, t, valid_q);
    } else {
      bwd90_ds<BM, false>(dpt, st, delta_tile, t, valid_q);
    }
    uint32_t ap[BM / 16][4], as[BM / 16][4];
    bwd90_fragments_and_ds<T>(st, dpt, ap, as, ds_lane_addr + b * T::kDSBytes);
    mbar_arrive_warp(ds_bar(b, wg), lane);

    // dV += P^T dO and dK += dS^T Q.
    bwd90_issue_dv_dk<T>(dv, dk, ap, as, do_buf, q_buf);
    wgmma_wait<0>();
    fence_registers(dk);
    fence_registers(dv);
    __syncwarp();
    release_stage(it);
  };

  if (n_iter > 0) {
    step(0, 0, 0, std::false_type{});
  } else {
    cp_async_wait<0>();  // no step read V; its copies still finish before the block ends
  }
  for (int it = 1, qt = n_qt > 1 ? 1 : 0, hg = n_qt > 1 ? 0 : 1; it < n_iter; ++it) {
    step(it, qt, hg, std::true_type{});
    if (++qt == n_qt) {
      qt = 0;
      ++hg;
    }
  }
  if (n_iter > 0) {  // the last step's dQ, carried past the loop
    float dq[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dq[i] = 0.f;
    mbar_wait(ds_bar((n_iter - 1) & 1, wg), ((n_iter - 1) >> 1) & 1);
    wgmma_fence();
    bwd90_issue_dq<T>(dq, ds_addr, k_addr, dq_k_atom, dq_ds_atom, dq_key_step0, n_iter - 1);
    wgmma_wait<0>();
    fence_registers(dq);
    fence_registers(dk);
    fence_registers(dv);
    bwd90_store_dq<T>(dq, dq_addr, n_iter - 1, cwarp, wg, g, t);
  }

  store_dk_dv<D>(p, dk, dv, key_local, t, item.kv_rows, key_row0, kv_stride, kv_head);
#endif
}

}  // namespace cad::kernels::detail
