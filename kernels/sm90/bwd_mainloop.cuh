// sm90/bwd_mainloop.cuh -- the Hopper backward's pipeline, both sides of it:
//  - producer (one warp): per step (query head, 64-query tile), TMA loads of Q and dO into a ring of
//    kStages stages, and by bulk copies the LSE (base 2) and Delta of those queries; each stage has a full
//    mbarrier (one arrival + the bytes of all four) and an "empty" named barrier (sm90/bwd_traits.cuh's ids);
//  - consumer (one warpgroup of 64 keys): the step's matrix products on wgmma -- S^T = K Q^T and
//    dP^T = V dO^T (shared x shared), dV += P^T dO and dK += dS^T Q (A from registers), dQ = dS K (dS^T
//    through shared memory) -- and the shared-memory work around them: zeroing Q/dO rows past the segment,
//    writing dS^T in wgmma's layout.
// The elementwise work between the products is sm90/bwd_softmax.cuh; dQ's way out and dK/dV are
// sm90/bwd_epilogue.cuh. Shared-memory addresses are byte addresses of the block's map (bwd_traits).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "attention_internal.h"
#include "sm90/async.cuh"
#include "sm90/bwd_traits.cuh"
#include "sm90/tiles.cuh"
#include "sm90/wgmma.cuh"

namespace cad::kernels::detail {

// ---- producer ------------------------------------------------------------------------------------------
// Every step of the block: stage s = it % kStages, refilled once the consumers of step it - kStages are
// done with it. full_bar(s) = bars + 8 s.
// First float of step (h, q0)'s statistics in the [hq, tq] arrays, and its offset from the 16-byte
// boundary the stage's copy starts at (both sides compute it the same way).
__device__ __forceinline__ int64_t bwd90_stat_index(const BwdParams& p, const BwdItem& item, int h, int q0) {
  return static_cast<int64_t>(h) * p.tq + item.q_row + q0;
}
__device__ __forceinline__ int bwd90_stat_shift(const BwdParams& p, const BwdItem& item, int h, int q0) {
  return static_cast<int>(bwd90_stat_index(p, item, h, q0) & 3);
}

template <typename T>
__device__ __forceinline__ void bwd90_producer(const BwdParams& p, const BwdItem& item, int kv_head,
                                               const CUtensorMap* tm_q, const CUtensorMap* tm_do,
                                               const CUtensorMap* tm_lse, const CUtensorMap* tm_delta, uint32_t q_addr,
                                               uint32_t do_addr, uint32_t bars, uint32_t lse_addr, uint32_t delta_addr,
                                               int n_qt, int n_iter, int lane) {
  constexpr int D = T::kD, BM = T::kBlockM, S = T::kStages;
  auto full_bar = [&](int s) { return bars + 8 * s; };
  if (lane == 0) {
    tma_prefetch_descriptor(tm_q);
    tma_prefetch_descriptor(tm_do);
    tma_prefetch_descriptor(tm_lse);
    tma_prefetch_descriptor(tm_delta);
  }
  for (int it = 0; it < n_iter; ++it) {
    const int s = it % S;
    // Step it - S's consumers are done with stage s (their arrivals for that step pair with this sync:
    // neither side can reach the next use of the id before this one completes).
    if (it >= S) named_barrier_sync(kBwdBarStageEmpty + s, kBwdStageBarThreads);
    const int h = kv_head * p.group + it / n_qt;
    const int q0 = item.q_begin + (it % n_qt) * BM;
    const int row = static_cast<int>(item.q_row) + q0;
    if (lane == 0) {
      // Everything a step reads comes by TMA, so the stage's full barrier hands it over the way
      // compute-sanitizer's racecheck follows (it reports a thread's st.shared, or a plain bulk copy, handed
      // over through an mbarrier as a hazard). Rows past the segment bring other rows' values: the
      // consumers zero those Q/dO rows and mask those statistics. The statistics come from the workspace copies the
      // preprocess wrote, from the 16-byte boundary at or before the tile's first row (a TMA box must start
      // 16-byte aligned: one started at the row itself stopped the kernel with an illegal instruction on an
      // H200, record bwd_variants_h200x1_2026-12-03_4d1ff9b).
      mbar_arrive_expect_tx(full_bar(s), 2 * T::kQBytes + 2 * T::kStatLoadBytes);
#pragma unroll
      for (int a = 0; a < D / 64; ++a) {
        tma_load_3d(q_addr + s * T::kQBytes + a * BM * 128, tm_q, a * 64, h, row, full_bar(s));
        tma_load_3d(do_addr + s * T::kQBytes + a * BM * 128, tm_do, a * 64, h, row, full_bar(s));
      }
      const int first = static_cast<int>(bwd90_stat_index(p, item, h, q0) & ~int64_t{3});
      tma_load_2d(lse_addr + s * T::kStatBytes, tm_lse, first, 0, full_bar(s));
      tma_load_2d(delta_addr + s * T::kStatBytes, tm_delta, first, 0, full_bar(s));
    }
  }
}

// ---- consumer ------------------------------------------------------------------------------------------
// Rows valid_q.. of the stage's Q and dO tiles set to 0 (a partial last query tile: TMA brought whatever
// follows in memory, and 0 * garbage must not reach dK/dV). Their LSE and Delta are not touched here (a
// consumer's store there would meet the other warpgroup's reads of the stage's previous use, ordered only
// through the mbarriers): the softmax masks them (P = 0, Delta taken as 0). 16-byte chunks, 8 per 128-byte
// atom row, D/64 atoms per tile, 2 tiles; ctid = 0..255 over both consumer warpgroups. The caller syncs the
// consumers.
template <typename T>
__device__ __forceinline__ void bwd90_zero_rows_past_end(uint32_t q_buf, uint32_t do_buf, int valid_q, int ctid) {
  constexpr int D = T::kD, BM = T::kBlockM;
  constexpr int kRowChunks = 2 * (D / 64) * 8, kTileShift = D == 128 ? 4 : 3;  // log2(kRowChunks / 2)
  const int chunks = (BM - valid_q) * kRowChunks;
  for (int c = ctid; c < chunks; c += 256) {
    const int row = valid_q + c / kRowChunks, rest = c % kRowChunks;
    const uint32_t addr = ((rest >> kTileShift) ? do_buf : q_buf) + ((rest >> 3) & (D / 64 - 1)) * BM * 128 +
                          row * 128 + (rest & 7) * 16;
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
  }
  fence_proxy_async_smem();
}

// acc = A B^T as one wgmma group (fence, products, commit; the caller waits): A = this warpgroup's 64
// rows of the K (or V) tile at a_addr, B = the stage's Q (or dO) tile (BM = 64 or 128 queries, the products'
// N) -- S^T = K Q^T, dP^T = V dO^T.
template <typename T>
__device__ __forceinline__ void bwd90_issue_keys_x_queries(float (&acc)[T::kBlockM / 2], uint32_t a_addr,
                                                           uint32_t b_buf, int wg) {
  constexpr int D = T::kD, BM = T::kBlockM, BN = T::kBlockN;
  const SmemTileDesc a(a_addr + wg * 64 * 128, 0, 1024), b(b_buf, 0, 1024);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t da = a.at((kk >> 2) * BN * 128 + (kk & 3) * 32), db = b.at((kk >> 2) * BM * 128 + (kk & 3) * 32);
    if constexpr (BM == 128) {  // D=64's 128-query steps
      if (kk == 0) {
        wgmma_m64n128k16_ss_first(acc, da, db);
      } else {
        wgmma_m64n128k16_ss(acc, da, db, 1);
      }
    } else if (kk == 0) {
      wgmma_m64n64k16_ss_first(acc, da, db);
    } else {
      wgmma_m64n64k16_ss(acc, da, db, 1);
    }
  }
  wgmma_commit();
}

// Where lane `lane` of consumer warp `cwarp` starts its part of dS^T's store (bwd90_fragments_and_ds), as a byte
// offset into a dS^T buffer: the row address stmatrix takes from it for the step's first 16 queries, row lane % 8
// of matrix lane / 8 -- key cwarp * 16 + lane % 8 (+ 8 for matrices 1 and 3), queries 0..7 (8..15 for matrices 2
// and 3), its 16-byte chunk XOR-swizzled by key % 8 = lane % 8 (sm90/tiles.cuh's atom_swizzled). Constant over
// the block's steps.
__device__ __forceinline__ uint32_t bwd90_ds_lane_offset(int cwarp, int lane) {
  const uint32_t key = cwarp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, upper = lane >> 4;
  return key * 128 + ((upper ^ (lane & 7)) << 4);
}

// P^T and dS^T (accumulators) -> bf16 A fragments of 16 queries each (ap, as); dS^T also to shared memory
// (keys x queries, wgmma's swizzled atoms) for the dQ product, made visible to the async proxy. ds_row_addr =
// the dS^T buffer's address + bwd90_ds_lane_offset. A fragment kq is four 8x8 matrices of the accumulator
// layout, stored by one stmatrix: queries 16 kq.. are chunks 2 kq and 2 kq + 1 of a row (of atom kq / 4), whose
// swizzle moves them to chunk (2 kq + upper) ^ (key % 8) = 2 (kq % 4) ^ (the lane's chunk for kq = 0); the
// buffer is 1024-byte aligned, so that is an XOR of the row address with (kq % 4) << 5.
template <typename T>
__device__ __forceinline__ void bwd90_fragments_and_ds(const float (&st)[T::kBlockM / 2],
                                                       const float (&dpt)[T::kBlockM / 2],
                                                       uint32_t (&ap)[T::kBlockM / 16][4],
                                                       uint32_t (&as)[T::kBlockM / 16][4], uint32_t ds_row_addr) {
  constexpr int BM = T::kBlockM, BN = T::kBlockN;
#pragma unroll
  for (int kq = 0; kq < BM / 16; ++kq) {
    accumulator_to_a_fragment(st, kq, ap[kq]);
    accumulator_to_a_fragment(dpt, kq, as[kq]);
    stmatrix_x4((ds_row_addr ^ ((kq & 3) << 5)) + (kq >> 2) * BN * 128, as[kq]);
  }
  fence_proxy_async_smem();  // dS^T was written by generic-proxy stores (stmatrix); wgmma reads it
}

// dV/dK += A (16 queries from registers) x B (16 x D, stored N-contiguous in shared memory).
template <int D>
__device__ __forceinline__ void wgmma_rs_tb_d(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (D == 128) {
    wgmma_m64n128k16_rs_tb(d, a, desc_b, 1);
  } else {
    wgmma_m64n64k16_rs_tb(d, a, desc_b, 1);
  }
}

// acc += A B^T over the step's queries, 16 per product: A from registers (P^T or dS^T), B = dO or Q (read
// transposed); no fence, no commit (the caller groups the products).
template <typename T>
__device__ __forceinline__ void bwd90_rs_products(float (&acc)[T::kD / 2], const uint32_t (&a)[T::kBlockM / 16][4],
                                                  uint32_t b_buf) {
  constexpr int D = T::kD, BM = T::kBlockM;
  const SmemTileDesc b(b_buf, BM * 128, 1024);
#pragma unroll
  for (int kq = 0; kq < BM / 16; ++kq) wgmma_rs_tb_d<D>(acc, a[kq], b.at(kq * 16 * 128));
}

// dV += P^T dO and dK += dS^T Q as one wgmma group (16 queries per product; dO / Q read transposed).
template <typename T>
__device__ __forceinline__ void bwd90_issue_dv_dk(float (&dv)[T::kD / 2], float (&dk)[T::kD / 2],
                                                  const uint32_t (&ap)[T::kBlockM / 16][4],
                                                  const uint32_t (&as)[T::kBlockM / 16][4], uint32_t do_buf,
                                                  uint32_t q_buf) {
  constexpr int D = T::kD, BM = T::kBlockM;
  const SmemTileDesc d_o(do_buf, BM * 128, 1024), q(q_buf, BM * 128, 1024);
  wgmma_fence();
#pragma unroll
  for (int kq = 0; kq < BM / 16; ++kq) wgmma_rs_tb_d<D>(dv, ap[kq], d_o.at(kq * 16 * 128));
#pragma unroll
  for (int kq = 0; kq < BM / 16; ++kq) wgmma_rs_tb_d<D>(dk, as[kq], q.at(kq * 16 * 128));
  wgmma_commit();
}

// dQ(j) = dS(j) K, one 64 x 64 tile per warpgroup (sm90/bwd_traits.cuh's kDQOwnKeys / kDQRowHalves), as one
// wgmma group: A = dS (queries contiguous in dS^T buffer j & 1; dq_ds_atom = the atom of this warpgroup's 64
// queries, 0 where a step has 64), B = K (head-dim contiguous). D=128: all 128 keys, K's atom wg (dq_k_atom =
// wg * BN * 128: columns 64wg..; dq_key_step0 = 0); D=64 with 64 queries: this warpgroup's 64 keys
// (dq_key_step0 = 4 wg), K's only atom; D=64 with 128 queries: queries 64wg.. (dq_ds_atom = wg * BN * 128)
// over all 128 keys. The offsets come from the caller, once per block (computed here per call, the SASS
// changed).
template <typename T>
__device__ __forceinline__ void bwd90_issue_dq(float (&dq)[32], uint32_t ds_addr, uint32_t k_addr, uint32_t dq_k_atom,
                                               uint32_t dq_ds_atom, int dq_key_step0, int j) {
  constexpr int BN = T::kBlockN;
  constexpr int kDQKeySteps = T::kDQOwnKeys ? 4 : BN / 16;
  const SmemTileDesc ds(ds_addr + (j & 1) * T::kDSBytes + dq_ds_atom + dq_key_step0 * 16 * 128, BN * 128, 1024);
  const SmemTileDesc k(k_addr + dq_k_atom + dq_key_step0 * 16 * 128, BN * 128, 1024);
#pragma unroll
  for (int i = 0; i < kDQKeySteps; ++i) wgmma_m64n64k16_ss_tt(dq, ds.at(i * 16 * 128), k.at(i * 16 * 128), i > 0 ? 1 : 0);
  wgmma_commit();
}

}  // namespace cad::kernels::detail
