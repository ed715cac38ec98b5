// sm80/bwd_kernel.cuh -- the portable varlen attention backward kernel (FlashAttention-2 style, sm_80 and
// later), its traits and main loop: loads, the S^T/dP^T products, dV/dK += P^T dO / dS^T Q, dS^T through
// shared memory and dQ = dS K. Its other concerns are files of their own:
//   sm80/bwd_softmax.cuh   P^T (masked) and dS^T
//   sm80/bwd_epilogue.cuh  dQ atomics per step, dK/dV at the end
//   sm80/bwd_launch.cuh    grid and launch (no scheduler: one block per work item and KV head)
// Tile loads (cp.async into the ldmatrix layout) are common/tile_load.cuh. The Hopper backward
// (sm90/bwd_kernel.cuh) runs the same work items with wgmma and warp specialisation.
//
// One block = one work item (a tile of bwd_block_n(D) keys of one segment) x one KV head. The K/V tile
// stays in shared memory; the block walks every query head of the KV head's group and every query
// tile that sees the keys, with Q/dO tiles double-buffered through cp.async. Each warp (4 at D=64, 8 at
// D=128) owns 16 keys and keeps their dK/dV in registers:
//   S^T = K Q^T, P^T = exp(S^T - LSE), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - Delta),
//   dK += dS^T Q; dS goes through shared memory so that the warps, now split by head-dim columns,
//   compute dQ = dS K and add it into an fp32 accumulator with atomics.
// dK/dV are written directly (bf16) when no other segment reads these keys, else added into fp32
// accumulators. Everything is pre-scaled by softmax_scale where the math asks for it.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "attention_internal.h"
#include "common/mma_utils.cuh"
#include "common/tile_load.cuh"
#include "sm80/bwd_epilogue.cuh"
#include "sm80/bwd_softmax.cuh"

namespace cad::kernels::detail {

template <int D>
struct BwdTraits {
  static constexpr int kWarps = bwd_warps(D);
  static constexpr int kBlockN = bwd_block_n(D);        // keys per block (16 per warp)
  static constexpr int kBlockM = D == 128 ? 32 : 64;    // queries per step (registers bound it at D=128)
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kDsStride = kBlockM + 8;          // padded row of the dS^T tile: no bank conflicts
  static constexpr int kSmemBytes = (2 * kBlockN * D + 4 * kBlockM * D + kBlockN * kDsStride) * 2 +
                                    4 * kBlockM * 4;
};

template <int D>
__global__ void __launch_bounds__(BwdTraits<D>::kThreads) attention_bwd_kernel(BwdParams p) {
  using T = BwdTraits<D>;
  constexpr int BM = T::kBlockM, BN = T::kBlockN, NT = T::kThreads, DS = T::kDsStride;
  constexpr int kWarpCols = D / T::kWarps;  // head-dim columns of dQ per warp
  static_assert(kWarpCols % 16 == 0, "each warp computes dQ in 16-column steps");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* sV = sK + BN * D;
  __nv_bfloat16* sQ = sV + BN * D;        // 2 buffers of BM x D
  __nv_bfloat16* sdO = sQ + 2 * BM * D;   // 2 buffers of BM x D
  __nv_bfloat16* sdS = sdO + 2 * BM * D;  // BN x DS: dS^T, keys x queries
  float* sLse = reinterpret_cast<float*>(sdS + BN * DS);  // 2 x BM, in base-2 units
  float* sDelta = sLse + 2 * BM;                          // 2 x BM

  const BwdItem item = p.items[blockIdx.x];
  const int kv_head = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;

  const int64_t q_stride = static_cast<int64_t>(p.hq) * D;
  const int64_t kv_stride = static_cast<int64_t>(p.hq / p.group) * D;
  const int64_t key_row0 = item.kv_row + item.kv_begin;
  load_tile_async<BN, D, NT>(sK, p.k + key_row0 * kv_stride + kv_head * D, kv_stride, item.kv_rows, tid);
  load_tile_async<BN, D, NT>(sV, p.v + key_row0 * kv_stride + kv_head * D, kv_stride, item.kv_rows, tid);

  const int q_span = item.q_end - item.q_begin;  // q_end: q_len unless a window_left ends the tile's queries
  const int n_qt = q_span > 0 ? (q_span + BM - 1) / BM : 0;
  const int n_iter = n_qt * p.group;

  // Starts the copies of step `it` (query head, query tile) into buffer `buf`.
  auto issue = [&](int it, int buf) {
    const int h = kv_head * p.group + it / n_qt;
    const int q0 = item.q_begin + (it % n_qt) * BM;
    const int64_t row = item.q_row + q0;
    load_tile_async<BM, D, NT>(sQ + buf * BM * D, p.q + row * q_stride + h * D, q_stride, item.q_len - q0, tid);
    load_tile_async<BM, D, NT>(sdO + buf * BM * D, p.d_o + row * q_stride + h * D, q_stride, item.q_len - q0, tid);
    if (tid < BM) {
      const bool valid = q0 + tid < item.q_len;
      const int64_t idx = static_cast<int64_t>(h) * p.tq + row + tid;
      sLse[buf * BM + tid] = valid ? p.lse[idx] * kLog2e : 0.f;
      sDelta[buf * BM + tid] = valid ? p.delta[idx] : 0.f;
    }
  };
  if (n_iter > 0) issue(0, 0);
  cp_async_commit();

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.f;
  }
  const int key_local = warp * 16 + g;  // this thread's keys: key_local and key_local + 8

  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_iter) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int h = kv_head * p.group + it / n_qt;
    const int q0 = item.q_begin + (it % n_qt) * BM;
    const __nv_bfloat16* q_tile = sQ + buf * BM * D;
    const __nv_bfloat16* do_tile = sdO + buf * BM * D;
    const float* lse_tile = sLse + buf * BM;
    const float* delta_tile = sDelta + buf * BM;

    // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x BM queries.
    float st[BM / 8][4], dpt[BM / 8][4];
#pragma unroll
    for (int i = 0; i < BM / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ak[4], av[4];
      ldmatrix_x4(ak, sK + swizzled<D>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
      ldmatrix_x4(av, sV + swizzled<D>(warp * 16 + (lane & 15), kk * 16 + (lane >> 4) * 8));
#pragma unroll
      for (int nn = 0; nn < BM / 16; ++nn) {
        const int r = nn * 16 + (lane & 7) + (lane >> 4) * 8, c = kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t bq[4], bo[4];
        ldmatrix_x4(bq, q_tile + swizzled<D>(r, c));
        ldmatrix_x4(bo, do_tile + swizzled<D>(r, c));
        mma_bf16(st[2 * nn], ak, bq[0], bq[1]);
        mma_bf16(st[2 * nn + 1], ak, bq[2], bq[3]);
        mma_bf16(dpt[2 * nn], av, bo[0], bo[1]);
        mma_bf16(dpt[2 * nn + 1], av, bo[2], bo[3]);
      }
    }

    // P^T (masked to 0 outside the segment and above the causal diagonal), then dS^T in dpt.
    bwd80_probabilities_and_ds<BM>(st, dpt, p, item, key_local, t, q0, lse_tile, delta_tile);

    // dV += P^T dO and dK += dS^T Q (A operands straight from registers).
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      uint32_t ap[4], as[4];
      ap[0] = pack_bf16(st[2 * kq][0], st[2 * kq][1]);
      ap[1] = pack_bf16(st[2 * kq][2], st[2 * kq][3]);
      ap[2] = pack_bf16(st[2 * kq + 1][0], st[2 * kq + 1][1]);
      ap[3] = pack_bf16(st[2 * kq + 1][2], st[2 * kq + 1][3]);
      as[0] = pack_bf16(dpt[2 * kq][0], dpt[2 * kq][1]);
      as[1] = pack_bf16(dpt[2 * kq][2], dpt[2 * kq][3]);
      as[2] = pack_bf16(dpt[2 * kq + 1][0], dpt[2 * kq + 1][1]);
      as[3] = pack_bf16(dpt[2 * kq + 1][2], dpt[2 * kq + 1][3]);
      // dS^T to shared memory for the dQ product below.
      *reinterpret_cast<uint32_t*>(sdS + key_local * DS + kq * 16 + 2 * t) = as[0];
      *reinterpret_cast<uint32_t*>(sdS + (key_local + 8) * DS + kq * 16 + 2 * t) = as[1];
      *reinterpret_cast<uint32_t*>(sdS + key_local * DS + kq * 16 + 8 + 2 * t) = as[2];
      *reinterpret_cast<uint32_t*>(sdS + (key_local + 8) * DS + kq * 16 + 8 + 2 * t) = as[3];
#pragma unroll
      for (int dd = 0; dd < D / 16; ++dd) {
        const int r = kq * 16 + (lane & 15), c = dd * 16 + (lane >> 4) * 8;
        uint32_t bo[4], bq[4];
        ldmatrix_x4_trans(bo, do_tile + swizzled<D>(r, c));
        ldmatrix_x4_trans(bq, q_tile + swizzled<D>(r, c));
        mma_bf16(dv[2 * dd], ap, bo[0], bo[1]);
        mma_bf16(dv[2 * dd + 1], ap, bo[2], bo[3]);
        mma_bf16(dk[2 * dd], as, bq[0], bq[1]);
        mma_bf16(dk[2 * dd + 1], as, bq[2], bq[3]);
      }
    }
    __syncthreads();  // all of dS^T is in shared memory

    // dQ[BM x D] = dS K; this warp computes columns [warp * kWarpCols, +kWarpCols).
    float dq[BM / 16][kWarpCols / 8][4];
#pragma unroll
    for (int mm = 0; mm < BM / 16; ++mm) {
#pragma unroll
      for (int dn = 0; dn < kWarpCols / 8; ++dn) dq[mm][dn][0] = dq[mm][dn][1] = dq[mm][dn][2] = dq[mm][dn][3] = 0.f;
    }
#pragma unroll
    for (int kn = 0; kn < BN / 16; ++kn) {
      uint32_t a[BM / 16][4];
#pragma unroll
      for (int mm = 0; mm < BM / 16; ++mm) {
        // dS^T is stored keys x queries; the transposing load yields A = dS (queries x keys).
        ldmatrix_x4_trans(a[mm], sdS + (kn * 16 + (lane & 7) + ((lane >> 4) & 1) * 8) * DS + mm * 16 +
                                     ((lane >> 3) & 1) * 8);
      }
#pragma unroll
      for (int dd = 0; dd < kWarpCols / 16; ++dd) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, sK + swizzled<D>(kn * 16 + (lane & 15), warp * kWarpCols + dd * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int mm = 0; mm < BM / 16; ++mm) {
          mma_bf16(dq[mm][2 * dd], a[mm], b[0], b[1]);
          mma_bf16(dq[mm][2 * dd + 1], a[mm], b[2], b[3]);
        }
      }
    }
    bwd80_add_dq<D, BM, kWarpCols>(p, item, dq, q0, h, q_stride, warp * kWarpCols, g, t);
  }
  if (n_iter == 0) cp_async_wait<0>();

  bwd80_store_dk_dv<D>(p, dk, dv, key_local, t, item.kv_rows, key_row0, kv_stride, kv_head);
}

}  // namespace cad::kernels::detail
