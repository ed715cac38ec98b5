// sm90/bwd_epilogue.cuh -- the outputs of the Hopper backward:
//  - dQ, every step: each consumer warpgroup writes its 64 fp32 columns of dQ(j) (unscaled: the conversion
//    to bf16 after the kernel applies softmax_scale once per element instead of once per step) into shared
//    buffer j % kDQBuffers in TMA's layout, and the dQ writer warp adds the buffer to the global fp32
//    accumulator with TMA reductions (cp.reduce.async.bulk.tensor add) instead of per-thread atomics; the
//    two sides hand the buffer back and forth through named barriers (full: consumers arrive, writer
//    waits; empty: the other way round);
//  - dK and dV of the block's keys at its end, per consumer thread from its wgmma accumulators.
#pragma once

#include <cstdint>

#include "attention_internal.h"
#include "common/mma_utils.cuh"
#include "sm90/async.cuh"
#include "sm90/bwd_traits.cuh"

namespace cad::kernels::detail {

// ---- dQ ------------------------------------------------------------------------------------------------
// The dQ writer warp: per step, once buffer b is full, four boxes of 64 rows x 32 columns added into the
// accumulator (at D=64 with 64-query steps, boxes 2 and 3 are the second warpgroup's partial of the same
// columns; with 128-query steps, the second warpgroup's 64 queries). With
// kBwdDQPerWarpgroup there is one writer warp per consumer warpgroup (`wg`), adding that warpgroup's two boxes
// as soon as it has filled them, whatever the other one is doing.
template <typename T>
__device__ __forceinline__ void bwd90_dq_writer(const BwdParams& p, const BwdItem& item, int kv_head,
                                                const CUtensorMap* tm_dq, uint32_t dq_addr, int n_qt, int n_iter,
                                                int lane, int wg = 0) {
  constexpr int D = T::kD, BM = T::kBlockM, NB = T::kDQBuffers;
  if (lane == 0) tma_prefetch_descriptor(tm_dq);
  for (int it = 0; it < n_iter; ++it) {
    const int b = it % NB;
    // Boxes c0..c0+nc-1 of buffer b, once their writers have filled them; handed back when read.
    auto reduce = [&](int c0, int nc, int wg) {
      named_barrier_sync(bwd_dq_bar(kBwdBarDQFull, b, wg), kBwdDQBarThreads);
      if (lane == 0) {
        const int h = kv_head * p.group + it / n_qt;
        const int q0 = item.q_begin + (it % n_qt) * BM;
        const int row = static_cast<int>(item.q_row) + q0;
#pragma unroll
        for (int c = c0; c < c0 + nc; ++c) {
          // Box c: columns (32 c) % D; with kDQRowHalves, rows 64 (c / 2).. of the step (warpgroup c / 2's).
          const int box_row = T::kDQRowHalves ? row + (c / 2) * T::kDQBoxRows : row;
          tma_reduce_add_3d(dq_addr + b * T::kDQBytes + c * T::kDQBoxBytes, tm_dq, (c * 32) % D, h, box_row);
        }
        bulk_commit();
        bulk_wait_read_all();
      }
      __syncwarp();
      // Buffer b is used again at step it + NB (arrive only when someone will wait for it).
      if (it + NB < n_iter) named_barrier_arrive(bwd_dq_bar(kBwdBarDQEmpty, b, wg), kBwdDQBarThreads);
    };
    if constexpr (kBwdDQPerWarpgroup) {
      reduce(2 * wg, 2, wg);  // this writer's warpgroup's boxes
    } else {
      reduce(0, 4, 0);
    }
  }
  if (lane == 0) bulk_wait_all();
}

// A consumer thread's part of dQ(j) (unscaled) into shared buffer j % kDQBuffers: 4 boxes of 64 rows x 32
// fp32 columns, 128-byte swizzle (TMA's layout), boxes 2wg and 2wg + 1 from warpgroup wg; then the buffer
// is handed to the dQ writer. cwarp = consumer warp 0..7, g = lane / 4, t = lane % 4.
template <typename T>
__device__ __forceinline__ void bwd90_store_dq(const float (&dq)[32], uint32_t dq_addr, int j,
                                               int cwarp, int wg, int g, int t) {
  constexpr int NB = T::kDQBuffers;
  const int b = j % NB;
  if (j >= NB) named_barrier_sync(bwd_dq_bar(kBwdBarDQEmpty, b, wg), kBwdDQBarThreads);
  const uint32_t dq_buf = dq_addr + b * T::kDQBytes;
  // A 64-bit store is served per half-warp (16 lanes, 128 bytes). Half-warp h holds 4 of the warp's 8 rows
  // (g = 4h..4h+3). If every lane stored n8 block i in instruction i, lanes t = 0,1 and t = 2,3 would write
  // chunks 2c and 2c + 1 (c = i % 4) of those rows, which the row XOR-swizzle maps onto only 4 distinct
  // 16-byte chunks: every bank twice, two wavefronts per half-warp (ncu on H200: 2.5 wavefronts per
  // shared-store request in this kernel, 1.5 ideal). Lanes t = 2,3 therefore store block i ^ 2 (units
  // 4 apart), so the 16 lanes cover 8 distinct chunks: one wavefront per half-warp. The values are picked
  // by a select, not by a lane-dependent register index (which would go through local memory).
  const bool upper = (t & 2) != 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = (cwarp % 4) * 16 + g + r * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int nt = upper ? i ^ 2 : i;
      const int box = 2 * wg + nt / 4, unit = (nt % 4) * 2 + t / 2;
      const uint32_t addr = dq_buf + box * T::kDQBoxBytes + row * 128 + ((unit ^ (row & 7)) << 4) + (t & 1) * 8;
      const float v0 = upper ? dq[(i ^ 2) * 4 + 2 * r] : dq[i * 4 + 2 * r];
      const float v1 = upper ? dq[(i ^ 2) * 4 + 2 * r + 1] : dq[i * 4 + 2 * r + 1];
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(v0), "f"(v1)
                   : "memory");
    }
  }
  fence_proxy_async_smem();
  named_barrier_arrive(bwd_dq_bar(kBwdBarDQFull, b, wg), kBwdDQBarThreads);
}

// ---- dK, dV --------------------------------------------------------------------------------------------

// Writes this thread's dK (scaled) and dV rows of a key tile: directly in bf16 when every key row has one
// writer (exclusive KV), else added to the fp32 accumulators.
template <int D>
__device__ __forceinline__ void store_dk_dv(const BwdParams& p, const float (&dk)[D / 2], const float (&dv)[D / 2],
                                            int key_local, int t, int kv_rows, int64_t key_row0, int64_t kv_stride,
                                            int kv_head) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_local + r * 8;
    if (key >= kv_rows) continue;
    const int64_t offset = (key_row0 + key) * kv_stride + kv_head * D + 2 * t;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
      const float k0 = dk[dn * 4 + 2 * r] * p.scale, k1 = dk[dn * 4 + 2 * r + 1] * p.scale;
      const float v0 = dv[dn * 4 + 2 * r], v1 = dv[dn * 4 + 2 * r + 1];
      if (p.kv_exclusive) {
        *reinterpret_cast<uint32_t*>(p.d_k + offset + dn * 8) = pack_bf16(k0, k1);
        *reinterpret_cast<uint32_t*>(p.d_v + offset + dn * 8) = pack_bf16(v0, v1);
      } else {
        atomic_add_pair(p.dk_acc + offset + dn * 8, k0, k1);
        atomic_add_pair(p.dv_acc + offset + dn * 8, v0, v1);
      }
    }
  }
}

}  // namespace cad::kernels::detail
