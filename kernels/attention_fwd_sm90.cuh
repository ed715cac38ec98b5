// attention_fwd_sm90.cuh -- the Hopper (sm_90a) forward kernel: the same work items and online
// softmax as attention_fwd.cuh, with the two matrix products on wgmma instead of mma.sync.
//
// One block = two warpgroups = kFwdBlockM90 (128) queries of one work item x one query head. Q and
// double-buffered K/V tiles sit in shared memory in wgmma's 128-byte-swizzled layout (atoms of 64
// head-dim columns); S = Q K^T reads both operands from shared memory, O += P V takes P straight from
// the score registers and V as a transposed (N-contiguous) operand. Compiled to a stub everywhere but
// sm_90a; the launcher only picks it where the sm_90a binary is loaded.
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "attention_internal.h"
#include "mma_utils.cuh"
#include "sm90_tiles.cuh"
#include "wgmma_ops.cuh"

namespace cad::kernels::detail {

template <int D>
struct Fwd90Traits {
  static constexpr int kBlockM = kFwdBlockM90;  // 2 warpgroups x 64 rows
  static constexpr int kBlockN = 64;
  static constexpr int kThreads = 256;
  static constexpr int kSmemBytes = (kBlockM * D + 4 * kBlockN * D) * 2 + 1024;  // + alignment slack
};

template <int D>
__global__ void __launch_bounds__(Fwd90Traits<D>::kThreads, 2) attention_fwd_sm90_kernel(FwdParams p) {
#ifdef CAD_SM90_KERNEL_BODY
  using T = Fwd90Traits<D>;
  constexpr int BM = T::kBlockM, BN = T::kBlockN, NT = T::kThreads;
  extern __shared__ unsigned char smem_raw[];
  // Swizzle atoms must start 1024-byte aligned.
  const uint32_t raw_addr = smem_addr(smem_raw);
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));
  __nv_bfloat16* sK = sQ + BM * D;      // 2 buffers of BN x D
  __nv_bfloat16* sV = sK + 2 * BN * D;  // 2 buffers of BN x D
  // Shared addresses and wgmma descriptors are re-derived from this one register in every tile (see
  // launder()) instead of being hoisted out of the loop: registers are what two blocks per SM lack.
  uint32_t smem_base = smem_addr(sQ);
  constexpr uint32_t kQBytes = BM * D * 2, kTileBytes = BN * D * 2;

  const FwdItem item = p.items[blockIdx.x];
  const int head = blockIdx.y;
  const int kv_head = head / p.group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warpgroup = warp / 4;
  const int g = lane / 4, t = lane % 4;

  const int64_t q_stride = static_cast<int64_t>(p.hq) * D;
  const int64_t kv_stride = static_cast<int64_t>(p.hq / p.group) * D;
  const __nv_bfloat16* gQ = p.q + item.q_row * q_stride + head * D;
  const __nv_bfloat16* gK = p.k + (item.kv_row + item.kv_begin) * kv_stride + kv_head * D;
  const __nv_bfloat16* gV = p.v + (item.kv_row + item.kv_begin) * kv_stride + kv_head * D;
  const int n_keys = item.kv_end - item.kv_begin;
  const int n_blocks = n_keys > 0 ? (n_keys + BN - 1) / BN : 0;

  load_tile_atoms_async<BM, D, NT>(sQ, gQ, q_stride, item.q_rows, tid);
  if (n_blocks > 0) {
    load_tile_atoms_async<BN, D, NT>(sK, gK, kv_stride, n_keys, tid);
    load_tile_atoms_async<BN, D, NT>(sV, gV, kv_stride, n_keys, tid);
  }
  cp_async_commit();

  float o_acc[D / 2];  // wgmma m64nD accumulator: [n8 block][4]
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.f;
  // With a positive scale the running max is kept on raw scores and the scale folds into the
  // exponent's FMA (one instruction less per score); otherwise scores are scaled first.
  const bool fold_scale = p.scale_log2 > 0.f;
  const float scale_eff = fold_scale ? p.scale_log2 : 1.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // in the units of the (raw or pre-scaled) scores
  float row_sum[2] = {0.f, 0.f};
  // Masks, in keys relative to kv_begin: row r of this thread sees key c iff c <= key_limit[r], and
  // tiles j >= mask_from hold a key that some row of this warp must not see.
  int key_limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = item.q_index + warp * 16 + g + r * 8;
    key_limit[r] = p.causal ? min(n_keys - 1, row + item.causal_offset - item.kv_begin) : n_keys - 1;
  }
  const int warp_limit =
      p.causal ? min(n_keys - 1, item.q_index + warp * 16 + item.causal_offset - item.kv_begin) : n_keys - 1;
  const int mask_from = warp_limit + 1 <= 0 ? 0 : (warp_limit + 1) / BN;

  // S = Q K^T for one KV tile (this warpgroup's 64 rows x BN keys), issued as one wgmma group; the
  // caller waits for it.
  auto issue_qk = [&](float(&s)[BN / 2], int buf) {
    const uint32_t q_addr = smem_base + warpgroup * 64 * 128;
    const uint32_t k_buf = smem_base + kQBytes + buf * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t col_bytes = (kk & 3) * 32;
      const uint64_t da = smem_desc_sw128(q_addr + (kk >> 2) * BM * 128 + col_bytes, 0, 1024);
      const uint64_t db = smem_desc_sw128(k_buf + (kk >> 2) * BN * 128 + col_bytes, 0, 1024);
      if (kk == 0) {
        wgmma_m64n64k16_ss_first(s, da, db);
      } else {
        wgmma_m64n64k16_ss(s, da, db, 1);
      }
    }
    wgmma_commit();
  };
  // O += P V: P from registers (16 keys per step), V transposed from shared memory; one wgmma group.
  auto issue_pv = [&](const uint32_t(&pa)[BN / 16][4], int buf) {
    const uint32_t v_buf = smem_base + kQBytes + 2 * kTileBytes + buf * kTileBytes;
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      // 16 keys = two 8-row groups (stride 1024 B); the next 64 head-dim columns are one atom (BN rows) on.
      const uint64_t db = smem_desc_sw128(v_buf + kk * 16 * 128, BN * 128, 1024);
      if constexpr (D == 128) {
        wgmma_m64n128k16_rs_tb(o_acc, pa[kk], db, 1);
      } else {
        wgmma_m64n64k16_rs_tb(o_acc, pa[kk], db, 1);
      }
    }
    wgmma_commit();
  };
  // Online softmax of tile j's scores in place (mask, running max/sum, exp2); returns in alpha the
  // factor by which each of this thread's two O rows must be rescaled (rescale_o applies it).
  auto softmax_tile = [&](float(&s)[BN / 2], int j, float(&alpha)[2]) {
    const bool need_mask = j >= mask_from;
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = fold_scale ? s[nt * 4 + e] : s[nt * 4 + e] * p.scale_log2;
        if (need_mask) {
          if (j * BN + nt * 8 + 2 * t + (e & 1) > key_limit[e >> 1]) x = -INFINITY;
        }
        s[nt * 4 + e] = x;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * r], s[nt * 4 + 2 * r + 1]));
      mx = warp_quad_max(mx);
      const float m_new = fmaxf(row_max[r], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new * scale_eff;  // in base-2 units
      alpha[r] = fast_exp2(fmaf(row_max[r], scale_eff, -m_use));
      row_max[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < BN / 8; ++nt) {
        s[nt * 4 + 2 * r] = fast_exp2(fmaf(s[nt * 4 + 2 * r], scale_eff, -m_use));
        s[nt * 4 + 2 * r + 1] = fast_exp2(fmaf(s[nt * 4 + 2 * r + 1], scale_eff, -m_use));
        sum += s[nt * 4 + 2 * r] + s[nt * 4 + 2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha[r] + sum;
    }
  };
  auto rescale_o = [&](const float(&alpha)[2]) {
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o_acc[dn * 4 + 2 * r] *= alpha[r];
        o_acc[dn * 4 + 2 * r + 1] *= alpha[r];
      }
    }
  };
  auto pack_p = [&](const float(&s)[BN / 2], uint32_t(&pa)[BN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = pack_bf16(s[(2 * kk) * 4 + 0], s[(2 * kk) * 4 + 1]);
      pa[kk][1] = pack_bf16(s[(2 * kk) * 4 + 2], s[(2 * kk) * 4 + 3]);
      pa[kk][2] = pack_bf16(s[(2 * kk + 1) * 4 + 0], s[(2 * kk + 1) * 4 + 1]);
      pa[kk][3] = pack_bf16(s[(2 * kk + 1) * 4 + 2], s[(2 * kk + 1) * 4 + 3]);
    }
  };
  auto load_kv = [&](__nv_bfloat16* dst, const __nv_bfloat16* src, int tile) {
    load_tile_atoms_async<BN, D, NT>(dst + (tile & 1) * BN * D, src + static_cast<int64_t>(tile) * BN * kv_stride,
                                     kv_stride, n_keys - tile * BN, tid);
  };

  // Per tile: barrier -> refill the other K/V buffers -> S gemm -> wait -> softmax -> P V gemm -> wait.
  // (Overlapping the softmax with the P V product inside the warpgroup, and issuing the S gemm before
  // the refill, both measured slower: docs/kernels.md, Performance.)
  for (int j = 0; j < n_blocks; ++j) {
    cp_async_wait<0>();        // tile j (the only copy in flight) has landed
    launder(smem_base);
    fence_proxy_async_smem();  // cp.async wrote through the generic proxy; wgmma reads through the async one
    // One barrier per tile: tile j is visible to every warp, and every warpgroup has finished tile j-1,
    // so its buffer can take tile j+1 while tile j is computed.
    __syncthreads();
    if (j + 1 < n_blocks) {
      load_kv(sK, gK, j + 1);
      load_kv(sV, gV, j + 1);
      cp_async_commit();
    }
    float s[BN / 2];
    wgmma_fence();
    issue_qk(s, j & 1);
    wgmma_wait_all();
    fence_registers(s);
    float alpha[2];
    softmax_tile(s, j, alpha);
    rescale_o(alpha);
    uint32_t pa[BN / 16][4];
    pack_p(s, pa);
    wgmma_fence();
    issue_pv(pa, j & 1);
    wgmma_wait_all();
    fence_registers(o_acc);
  }
  if (n_blocks == 0) cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = warp_quad_sum(row_sum[r]);
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const float lse = total > 0.f ? row_max[r] * scale_eff * kLn2 + logf(total) : -INFINITY;
    const int local_row = warp * 16 + g + r * 8;
    if (local_row >= item.q_rows) continue;
    if (item.partial_slot < 0) {
      __nv_bfloat16* out = p.o + (item.q_row + local_row) * q_stride + head * D;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<uint32_t*>(out + dn * 8 + 2 * t) =
            pack_bf16(o_acc[dn * 4 + 2 * r] * inv, o_acc[dn * 4 + 2 * r + 1] * inv);
      }
      if (t == 0) p.lse[static_cast<int64_t>(head) * p.tq + item.q_row + local_row] = lse;
    } else {
      const int64_t base = (static_cast<int64_t>(item.partial_slot) * p.hq + head) * BM + local_row;
      float* out = p.partial_o + base * D;
#pragma unroll
      for (int dn = 0; dn < D / 8; ++dn) {
        *reinterpret_cast<float2*>(out + dn * 8 + 2 * t) =
            make_float2(o_acc[dn * 4 + 2 * r] * inv, o_acc[dn * 4 + 2 * r + 1] * inv);
      }
      if (t == 0) p.partial_lse[base] = lse;
    }
  }
#endif
}

template <int D>
cudaError_t launch_attention_fwd_sm90(const FwdParams& p, int num_items, cudaStream_t stream) {
  using T = Fwd90Traits<D>;
  if (num_items == 0 || p.hq == 0) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(attention_fwd_sm90_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         T::kSmemBytes);
  if (err != cudaSuccess) return err;
  attention_fwd_sm90_kernel<D><<<dim3(num_items, p.hq), T::kThreads, T::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

// True when the loaded binary of the sm_90a kernel is real sm_90 code (not the stub of another arch).
template <int D>
bool attention_fwd_sm90_loaded() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, attention_fwd_sm90_kernel<D>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
}

}  // namespace cad::kernels::detail
