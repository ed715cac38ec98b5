// attention_bwd_sm90.cuh -- the Hopper (sm_90a) backward kernel for head dims 64 and 128: the work items
// and math of attention_bwd.cuh with all five matrix products on wgmma.
//
// One block = bwd_block_n(D) keys of one work item x one KV head: two warpgroups (128 keys) at D=128,
// one warpgroup (64 keys, several blocks per SM) at D=64. Each warpgroup owns 64 keys and keeps their
// dK/dV (64 x D fp32 each) in registers. Per step of 64 queries:
//   S^T = K Q^T, dP^T = V dO^T          (shared x shared)
//   dV += P^T dO, dK += dS^T Q          (P^T / dS^T from registers, dO / Q transposed from shared)
//   dQ = dS K                           (dS^T through shared memory; warpgroup w: columns 64w..64w+63)
// dQ goes into the fp32 accumulator with vector atomics, as in the portable kernel.
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "attention_internal.h"
#include "mma_utils.cuh"
#include "sm90_tiles.cuh"
#include "wgmma_ops.cuh"

namespace cad::kernels::detail {

template <int D>
struct Bwd90Traits {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr int kD = D;
  static constexpr int kWarpgroups = D == 128 ? 2 : 1;
  static constexpr int kBlockN = 64 * kWarpgroups;  // keys per block: 64 per warpgroup
  static constexpr int kBlockM = 64;                // queries per step
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kSmemBytes = (2 * kBlockN * kD + 4 * kBlockM * kD + kBlockN * kBlockM) * 2 +
                                    4 * kBlockM * 4 + 1024;
  // Blocks per SM: one at D=128 (255 registers per thread); three at D=64 (58 KiB of shared memory
  // each, at most 168 registers per thread).
  static constexpr int kMinBlocks = D == 128 ? 1 : 3;
};
static_assert(Bwd90Traits<128>::kBlockN == bwd_block_n(128), "the plan's key tiles must match the kernel's");
static_assert(Bwd90Traits<64>::kBlockN == bwd_block_n(64), "the plan's key tiles must match the kernel's");
static_assert(Bwd90Traits<64>::kMinBlocks * (Bwd90Traits<64>::kSmemBytes + 1024) <= 228 * 1024,
              "D=64: the blocks per SM promised to the compiler must fit in shared memory");

// dV/dK += A (16 queries from registers) x B (16 x D, stored N-contiguous in shared memory).
template <int D>
__device__ __forceinline__ void wgmma_rs_tb_d(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (D == 128) {
    wgmma_m64n128k16_rs_tb(d, a, desc_b, 1);
  } else {
    wgmma_m64n64k16_rs_tb(d, a, desc_b, 1);
  }
}

template <int D>
__global__ void __launch_bounds__(Bwd90Traits<D>::kThreads, Bwd90Traits<D>::kMinBlocks)
    attention_bwd_sm90_kernel(BwdParams p) {
#ifdef CAD_SM90_KERNEL_BODY
  using T = Bwd90Traits<D>;
  constexpr int BM = T::kBlockM, BN = T::kBlockN, NT = T::kThreads;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  __nv_bfloat16* sK = reinterpret_cast<__nv_bfloat16*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));
  __nv_bfloat16* sV = sK + BN * D;
  __nv_bfloat16* sQ = sV + BN * D;        // 2 buffers of BM x D
  __nv_bfloat16* sdO = sQ + 2 * BM * D;   // 2 buffers of BM x D
  __nv_bfloat16* sdS = sdO + 2 * BM * D;  // dS^T: BN keys x BM queries (one 64-column atom)
  float* sLse = reinterpret_cast<float*>(sdS + BN * BM);  // 2 x BM, base-2 units
  float* sDelta = sLse + 2 * BM;
  const uint32_t k_addr = smem_addr(sK), v_addr = smem_addr(sV), q_addr = smem_addr(sQ), do_addr = smem_addr(sdO),
                 ds_addr = smem_addr(sdS);

  const BwdItem item = p.items[blockIdx.x];
  const int kv_head = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = warp / 4;
  const int g = lane / 4, t = lane % 4;

  const int64_t q_stride = static_cast<int64_t>(p.hq) * D;
  const int64_t kv_stride = static_cast<int64_t>(p.hq / p.group) * D;
  const int64_t key_row0 = item.kv_row + item.kv_begin;
  load_tile_atoms_async<BN, D, NT>(sK, p.k + key_row0 * kv_stride + kv_head * D, kv_stride, item.kv_rows, tid);
  load_tile_atoms_async<BN, D, NT>(sV, p.v + key_row0 * kv_stride + kv_head * D, kv_stride, item.kv_rows, tid);

  const int q_span = item.q_len - item.q_begin;
  const int n_qt = q_span > 0 ? (q_span + BM - 1) / BM : 0;
  const int n_iter = n_qt * p.group;
  auto issue = [&](int it, int buf) {
    const int h = kv_head * p.group + it / n_qt;
    const int q0 = item.q_begin + (it % n_qt) * BM;
    const int64_t row = item.q_row + q0;
    load_tile_atoms_async<BM, D, NT>(sQ + buf * BM * D, p.q + row * q_stride + h * D, q_stride, item.q_len - q0, tid);
    load_tile_atoms_async<BM, D, NT>(sdO + buf * BM * D, p.d_o + row * q_stride + h * D, q_stride, item.q_len - q0,
                                     tid);
    if (tid < BM) {
      const bool valid = q0 + tid < item.q_len;
      const int64_t idx = static_cast<int64_t>(h) * p.tq + row + tid;
      sLse[buf * BM + tid] = valid ? p.lse[idx] * kLog2e : 0.f;
      sDelta[buf * BM + tid] = valid ? p.delta[idx] : 0.f;
    }
  };
  if (n_iter > 0) issue(0, 0);
  cp_async_commit();

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int key_local = warp * 16 + g;  // this thread's keys: key_local and key_local + 8

  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();  // step it (the only copy in flight) has landed
    fence_proxy_async_smem();
    // Step it is visible to every warp, and both warpgroups have waited for all their wgmma of step
    // it-1 (the dV/dK products of one warpgroup may still run when the other passes the dS barrier),
    // so only now may buffer buf^1 be refilled.
    __syncthreads();
    if (it + 1 < n_iter) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const int h = kv_head * p.group + it / n_qt;
    const int q0 = item.q_begin + (it % n_qt) * BM;
    const uint32_t q_buf = q_addr + buf * BM * D * 2, do_buf = do_addr + buf * BM * D * 2;
    const float* lse_tile = sLse + buf * BM;
    const float* delta_tile = sDelta + buf * BM;

    // S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 keys x BM queries.
    float st[BM / 2], dpt[BM / 2];
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) st[i] = dpt[i] = 0.f;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t a_off = (kk >> 2) * BN * 128 + wg * 64 * 128 + (kk & 3) * 32;
      const uint32_t b_off = (kk >> 2) * BM * 128 + (kk & 3) * 32;
      wgmma_m64n64k16_ss(st, smem_desc_sw128(k_addr + a_off, 0, 1024), smem_desc_sw128(q_buf + b_off, 0, 1024),
                         kk > 0 ? 1 : 0);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t a_off = (kk >> 2) * BN * 128 + wg * 64 * 128 + (kk & 3) * 32;
      const uint32_t b_off = (kk >> 2) * BM * 128 + (kk & 3) * 32;
      wgmma_m64n64k16_ss(dpt, smem_desc_sw128(v_addr + a_off, 0, 1024), smem_desc_sw128(do_buf + b_off, 0, 1024),
                         kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(st);
    fence_registers(dpt);

    // P^T (0 outside the segment and above the causal diagonal) and dS^T = P^T (dP^T - Delta).
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key_local + (e >> 1) * 8;
        const int ql = nt * 8 + 2 * t + (e & 1);
        const int q = q0 + ql;
        const bool valid = key < item.kv_rows && q < item.q_len &&
                           (!p.causal || item.kv_begin + key <= q + item.causal_offset);
        const float prob = valid ? fast_exp2(st[nt * 4 + e] * p.scale_log2 - lse_tile[ql]) : 0.f;
        st[nt * 4 + e] = prob;
        dpt[nt * 4 + e] = prob * (dpt[nt * 4 + e] - delta_tile[ql]);
      }
    }
    uint32_t ap[BM / 16][4], as[BM / 16][4];
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      ap[kq][0] = pack_bf16(st[(2 * kq) * 4 + 0], st[(2 * kq) * 4 + 1]);
      ap[kq][1] = pack_bf16(st[(2 * kq) * 4 + 2], st[(2 * kq) * 4 + 3]);
      ap[kq][2] = pack_bf16(st[(2 * kq + 1) * 4 + 0], st[(2 * kq + 1) * 4 + 1]);
      ap[kq][3] = pack_bf16(st[(2 * kq + 1) * 4 + 2], st[(2 * kq + 1) * 4 + 3]);
      as[kq][0] = pack_bf16(dpt[(2 * kq) * 4 + 0], dpt[(2 * kq) * 4 + 1]);
      as[kq][1] = pack_bf16(dpt[(2 * kq) * 4 + 2], dpt[(2 * kq) * 4 + 3]);
      as[kq][2] = pack_bf16(dpt[(2 * kq + 1) * 4 + 0], dpt[(2 * kq + 1) * 4 + 1]);
      as[kq][3] = pack_bf16(dpt[(2 * kq + 1) * 4 + 2], dpt[(2 * kq + 1) * 4 + 3]);
      // dS^T to shared memory, keys x queries, for dQ below.
      *reinterpret_cast<uint32_t*>(sdS + atom_swizzled<BN>(key_local, kq * 16 + 2 * t)) = as[kq][0];
      *reinterpret_cast<uint32_t*>(sdS + atom_swizzled<BN>(key_local + 8, kq * 16 + 2 * t)) = as[kq][1];
      *reinterpret_cast<uint32_t*>(sdS + atom_swizzled<BN>(key_local, kq * 16 + 8 + 2 * t)) = as[kq][2];
      *reinterpret_cast<uint32_t*>(sdS + atom_swizzled<BN>(key_local + 8, kq * 16 + 8 + 2 * t)) = as[kq][3];
    }

    // dV += P^T dO and dK += dS^T Q (16 queries per step; dO / Q read transposed).
    wgmma_fence();
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      wgmma_rs_tb_d<D>(dv, ap[kq], smem_desc_sw128(do_buf + kq * 16 * 128, BM * 128, 1024));
    }
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      wgmma_rs_tb_d<D>(dk, as[kq], smem_desc_sw128(q_buf + kq * 16 * 128, BM * 128, 1024));
    }
    wgmma_commit();
    fence_proxy_async_smem();  // dS^T was written with ordinary stores; wgmma reads it next
    __syncthreads();

    // dQ[BM x D] = dS K, 64 columns per warpgroup: A = dS (queries contiguous in sdS), B = K (head-dim
    // contiguous; warpgroup wg reads K's atom wg).
    float dq[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) dq[i] = 0.f;
#pragma unroll
    for (int kn = 0; kn < BN / 16; ++kn) {
      wgmma_m64n64k16_ss_tt(dq, smem_desc_sw128(ds_addr + kn * 16 * 128, BN * 128, 1024),
                            smem_desc_sw128(k_addr + wg * BN * 128 + kn * 16 * 128, BN * 128, 1024), kn > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait_all();
    fence_registers(dq);
    fence_registers(dk);
    fence_registers(dv);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q = q0 + (warp % 4) * 16 + g + r * 8;
      if (q >= item.q_len) continue;
      float* dst = p.dq_acc + (item.q_row + q) * q_stride + h * D + wg * 64 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        atomic_add_pair(dst + nt * 8, dq[nt * 4 + 2 * r] * p.scale, dq[nt * 4 + 2 * r + 1] * p.scale);
      }
    }
  }
  if (n_iter == 0) cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_local + r * 8;
    if (key >= item.kv_rows) continue;
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
#endif
}

template <int D>
cudaError_t launch_attention_bwd_sm90(const BwdParams& p, int num_items, cudaStream_t stream) {
  using T = Bwd90Traits<D>;
  if (num_items == 0 || p.hq == 0) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(attention_bwd_sm90_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::kSmemBytes);
  if (err != cudaSuccess) return err;
  attention_bwd_sm90_kernel<D><<<dim3(num_items, p.hq / p.group), T::kThreads, T::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cad::kernels::detail
