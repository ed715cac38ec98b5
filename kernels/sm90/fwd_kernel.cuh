// attention_fwd_sm90.cuh -- the Hopper (sm_90a) forward kernel: the same work items and online softmax
// as attention_fwd.cuh, organised the way Hopper wants it (warp specialisation, as in FlashAttention-3).
//
// One persistent block per SM walks (work item, query head) units. Three warpgroups:
//  - a producer (one thread issues everything) that loads Q and a ring of K/V tiles with TMA, each stage
//    guarded by a pair of mbarriers (full: bytes landed; empty: both consumers done with it);
//  - two consumers of 64 queries each. Per KV tile j a consumer issues S_j = Q K_j^T and O += P_{j-1} V_{j-1}
//    as two wgmma groups, then computes the softmax of S_j while the PV product runs. The two consumers
//    take turns to issue (named barriers), so one's softmax overlaps the other's products.
// Register budget: setmaxnreg moves registers from the producer to the consumers (S 64 + O 64 + P 32 live).
// Tiles sit in shared memory in wgmma's 128-byte-swizzled layout (atoms of 64 head-dim columns), which is
// what TMA writes with 128-byte swizzle. Compiled to a stub everywhere but sm_90a; the launcher only picks
// it where the sm_90a binary is loaded.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "attention_internal.h"
#include "common/mma_utils.cuh"
#include "sm90/async.cuh"
#include "sm90/arch.cuh"
#include "sm90/wgmma.cuh"

namespace cad::kernels::detail {

template <int D, int STAGES>
struct Fwd90Traits {
  static constexpr int kBlockM = kFwdBlockM90;  // 2 consumer warpgroups x 64 queries
  static constexpr int kBlockN = kFwdBlockN90;  // keys per K/V tile (the plan splits KV on these)
  static constexpr int kStages = STAGES;
  static constexpr int kThreads = 384;          // producer warpgroup + 2 consumer warpgroups
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128*40 + 256*232 = 384*168
  static constexpr uint32_t kQBytes = kBlockM * D * 2, kTileBytes = kBlockN * D * 2;
  static constexpr uint32_t kBarrierOffset = kQBytes + 2 * kStages * kTileBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 + 4 * kStages) * 8 + 1024;  // + alignment slack
};

// K/V stages in shared memory (head dim 128: 32 KiB of Q + 3 x 2 x 32 KiB = 224 KiB; 3 stages measured
// 1-6% faster than 2 on long KV).
template <int D>
constexpr int kFwd90Stages = D == 64 ? 4 : 3;

// Named barriers of the consumers: 1 + w = "consumer w may issue its products", 3 + w = warpgroup w only.
constexpr int kTurnBarrier = 1, kWarpgroupBarrier = 3;

// Unit (work item x query head) number `round` of block `block`: rounds alternate direction, so that with
// units sorted heaviest first every block gets a fair mix of heavy and light ones.
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

template <int D, int STAGES>
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
  const uint32_t sQ = raw_addr + ((1024 - (raw_addr & 1023)) & 1023);
  const uint32_t sK = sQ + T::kQBytes, sV = sK + S * T::kTileBytes, bars = sQ + T::kBarrierOffset;
  const uint32_t q_full = bars, q_empty = bars + 8;
  auto k_full = [&](int s) { return bars + 16 + 8 * s; };
  auto k_empty = [&](int s) { return bars + 16 + 8 * (S + s); };
  auto v_full = [&](int s) { return bars + 16 + 8 * (2 * S + s); };
  auto v_empty = [&](int s) { return bars + 16 + 8 * (3 * S + s); };
  constexpr uint32_t kConsumerWarps = 8;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, kConsumerWarps);
    for (int s = 0; s < S; ++s) {
      mbar_init(k_full(s), 1);
      mbar_init(k_empty(s), kConsumerWarps);
      mbar_init(v_full(s), 1);
      mbar_init(v_empty(s), kConsumerWarps);
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
    int tiles_issued = 0, units_done = 0;
    for (int u; (u = fwd_unit_of(units_done, blockIdx.x, gridDim.x)) < num_units; ++units_done) {
      const FwdUnit unit = fwd_unit_coords(u, num_units / p.hq, p.hq, p.group, gridDim.x, p.kv_head_bands != 0);
      const FwdItem item = p.items[unit.item];
      const int head = unit.head, kv_head = head / p.group;
      mbar_wait(q_empty, (units_done & 1) ^ 1);
      mbar_arrive_expect_tx(q_full, T::kQBytes);
#pragma unroll
      for (int a = 0; a < D / 64; ++a) tma_load_3d(sQ + a * BM * 128, &tm_q, a * 64, head, int(item.q_row), q_full);
      const int n_keys = item.kv_end - item.kv_begin;
      const int n_tiles = n_keys > 0 ? (n_keys + BN - 1) / BN : 0;
      const int row0 = int(item.kv_row + item.kv_begin);
      for (int j = 0; j < n_tiles; ++j, ++tiles_issued) {
        const int s = tiles_issued % S;
        const uint32_t parity = ((tiles_issued / S) & 1) ^ 1;
        mbar_wait(k_empty(s), parity);
        mbar_arrive_expect_tx(k_full(s), T::kTileBytes);
#pragma unroll
        for (int a = 0; a < D / 64; ++a)
          tma_load_3d(sK + s * T::kTileBytes + a * BN * 128, &tm_k, a * 64, kv_head, row0 + j * BN, k_full(s));
        mbar_wait(v_empty(s), parity);
        mbar_arrive_expect_tx(v_full(s), T::kTileBytes);
#pragma unroll
        for (int a = 0; a < D / 64; ++a)
          tma_load_3d(sV + s * T::kTileBytes + a * BN * 128, &tm_v, a * 64, kv_head, row0 + j * BN, v_full(s));
      }
    }
    return;
  }

  // ---- consumers ---------------------------------------------------------------------------------------
  registers_claim<T::kConsumerRegs>();
  const int cw = warp / 4 - 1;  // consumer warpgroup: queries 64*cw .. 64*cw + 63 of the tile
  const int wtid = tid - 128 - cw * 128;
  const int g = lane / 4, t = lane % 4;
  const int warp_row0 = cw * 64 + (warp % 4) * 16;  // this warp's first query in the tile
  const int64_t q_stride = static_cast<int64_t>(p.hq) * D;
  const bool fold_scale = p.scale_log2 > 0.f;
  const float scale_eff = fold_scale ? p.scale_log2 : 1.f;
  // Releases a stage (or Q) once every lane of this warp is done with it.
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };

  // S = Q K^T for one K stage (this warpgroup's 64 queries x BN keys), one wgmma group.
  auto issue_qk = [&](float(&s)[BN / 2], int stage) {
    const uint32_t q_addr = sQ + cw * 64 * 128;
    const uint32_t k_addr = sK + stage * T::kTileBytes;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t col_bytes = (kk & 3) * 32;
      const uint64_t da = smem_desc_sw128(q_addr + (kk >> 2) * BM * 128 + col_bytes, 0, 1024);
      const uint64_t db = smem_desc_sw128(k_addr + (kk >> 2) * BN * 128 + col_bytes, 0, 1024);
      if (kk == 0) {
        wgmma_m64n128k16_ss_first(s, da, db);
      } else {
        wgmma_m64n128k16_ss(s, da, db, 1);
      }
    }
    wgmma_commit();
  };
  // O += P V for one V stage: P from registers (16 keys per step), V as the transposed operand; one group.
  auto issue_pv = [&](float(&o)[D / 2], const uint32_t(&pa)[BN / 16][4], int stage) {
    const uint32_t v_addr = sV + stage * T::kTileBytes;
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
  };

  if (cw == 1) named_barrier_arrive(kTurnBarrier + 0, 256);  // consumer 0 takes the first turn
  int tiles_used = 0, units_done = 0;
  for (int u; (u = fwd_unit_of(units_done, blockIdx.x, gridDim.x)) < num_units; ++units_done) {
    const FwdUnit unit = fwd_unit_coords(u, num_units / p.hq, p.hq, p.group, gridDim.x, p.kv_head_bands != 0);
    const FwdItem item = p.items[unit.item];
    const int head = unit.head;
    const int n_keys = item.kv_end - item.kv_begin;
    const int n_tiles = n_keys > 0 ? (n_keys + BN - 1) / BN : 0;
    // Masks, in keys relative to kv_begin: row r of this thread sees key c iff c <= key_limit[r], and tiles
    // j >= mask_from hold a key that some row of this warp must not see (or lie past the segment's end).
    int key_limit[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = item.q_index + warp_row0 + g + r * 8;
      key_limit[r] = p.causal ? min(n_keys - 1, row + item.causal_offset - item.kv_begin) : n_keys - 1;
    }
    const int warp_limit =
        p.causal ? min(n_keys - 1, item.q_index + warp_row0 + item.causal_offset - item.kv_begin) : n_keys - 1;
    const int mask_from = warp_limit + 1 <= 0 ? 0 : (warp_limit + 1) / BN;

    float o_acc[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o_acc[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};  // in the units of the (raw or pre-scaled) scores
    float row_sum[2] = {0.f, 0.f};

    // Online softmax of tile j's scores in place; alpha = factor by which this thread's O rows must shrink.
    auto softmax_tile = [&](float(&s)[BN / 2], int j, float(&alpha)[2]) {
      // Two separate, warp-uniform branches: written as per-score selects, the compiler if-converts them
      // and every tile pays a compare, two selects and a multiply per score (about 250 of the 670
      // instructions per tile and thread).
      if (!fold_scale) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] *= p.scale_log2;
      }
      if (j >= mask_from) {
#pragma unroll
        for (int nt = 0; nt < BN / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            if (j * BN + nt * 8 + 2 * t + (e & 1) > key_limit[e >> 1]) s[nt * 4 + e] = -INFINITY;
          }
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

    mbar_wait(q_full, units_done & 1);
    if (n_tiles > 0) {
      float s[BN / 2];
      uint32_t pa[BN / 16][4];
      float alpha[2];
      // Tile 0: S only (there is no P yet).
      int stage = tiles_used % S;
      mbar_wait(k_full(stage), (tiles_used / S) & 1);
      named_barrier_sync(kTurnBarrier + cw, 256);
      wgmma_fence();
      issue_qk(s, stage);
      named_barrier_arrive(kTurnBarrier + (1 - cw), 256);
      wgmma_wait<0>();
      fence_registers(s);
      release(k_empty(stage));
      softmax_tile(s, 0, alpha);
      accumulator_to_a_fragments(s, pa);
      // Tile j: S_j and O += P_{j-1} V_{j-1} in flight together; softmax of S_j under the PV product.
      for (int j = 1; j < n_tiles; ++j) {
        const int prev = stage, prev_parity = ((tiles_used + j - 1) / S) & 1;
        stage = (tiles_used + j) % S;
        mbar_wait(k_full(stage), ((tiles_used + j) / S) & 1);
        mbar_wait(v_full(prev), prev_parity);
        named_barrier_sync(kTurnBarrier + cw, 256);
        wgmma_fence();
        issue_qk(s, stage);
        issue_pv(o_acc, pa, prev);
        named_barrier_arrive(kTurnBarrier + (1 - cw), 256);
        wgmma_wait<1>();
        fence_registers(s);
        release(k_empty(stage));
        softmax_tile(s, j, alpha);
        wgmma_wait<0>();
        fence_registers(o_acc);
        release(v_empty(prev));
        rescale_o(alpha);
        accumulator_to_a_fragments(s, pa);
      }
      // Last PV product. Key rows past the segment's end in the last tile were loaded from whatever follows
      // in memory; P is 0 there, but 0 * (Inf or NaN) is not, so they are zeroed first.
      const int last = (tiles_used + n_tiles - 1);
      mbar_wait(v_full(stage), (last / S) & 1);
      const int valid_rows = n_keys - (n_tiles - 1) * BN;
      if (valid_rows < BN) {
        const uint32_t v_addr = sV + stage * T::kTileBytes;
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
      issue_pv(o_acc, pa, stage);
      wgmma_wait<0>();
      fence_registers(o_acc);
      release(v_empty(stage));
      tiles_used += n_tiles;
    }
    release(q_empty);

    // ---- epilogue: normalise and write O and LSE (or the partial pair of a split-KV item) ----------------
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = warp_quad_sum(row_sum[r]);
      const float inv = total > 0.f ? 1.f / total : 0.f;
      const float lse = total > 0.f ? row_max[r] * scale_eff * kLn2 + logf(total) : -INFINITY;
      const int local_row = warp_row0 + g + r * 8;
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
  }
  // Consumer 1 arrived once more on consumer 0's turn barrier than consumer 0 waited (the first turn).
  if (cw == 0) named_barrier_sync(kTurnBarrier + 0, 256);
#endif
}

template <int D, int STAGES>
cudaError_t launch_attention_fwd_sm90_stages(const FwdParams& p, int num_items, cudaStream_t stream) {
  using T = Fwd90Traits<D, STAGES>;
  if (num_items == 0 || p.hq == 0) return cudaSuccess;
  CUtensorMap tm_q, tm_k, tm_v;
  const int hkv = p.hq / p.group;
  cudaError_t err = encode_rows_tensor_map(&tm_q, p.q, p.tq, p.hq, D, T::kBlockM);
  if (err == cudaSuccess) err = encode_rows_tensor_map(&tm_k, p.k, p.tk, hkv, D, T::kBlockN);
  if (err == cudaSuccess) err = encode_rows_tensor_map(&tm_v, p.v, p.tk, hkv, D, T::kBlockN);
  if (err != cudaSuccess) return err;
  int device = 0, sms = 0;
  err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  err = set_max_dynamic_smem_once<attention_fwd_sm90_kernel<D, STAGES>>(T::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t units = static_cast<int64_t>(num_items) * p.hq;
  if (units > INT32_MAX / 2) return cudaErrorInvalidValue;
  const int grid = static_cast<int>(std::min<int64_t>(units, sms));
  // Bands of items by KV head pay where there are many items of similar size (long sequences, whose KV
  // does not fit in L2 at once: Pretrain 128K buffer +5%); with few items a band holds items of every
  // size and breaks the heaviest-first order that balances the blocks (dense 4K: 498 -> 300 TFLOP/s;
  // the CAD mixed-shard batch of 148 items: -3%).
  FwdParams params = p;
  const int band_items = std::max(1, grid / p.group);
  params.kv_head_bands = (p.hq / p.group > 1 && num_items >= 8 * band_items) ? 1 : 0;
  attention_fwd_sm90_kernel<D, STAGES>
      <<<grid, T::kThreads, T::kSmemBytes, stream>>>(params, tm_q, tm_k, tm_v, static_cast<int>(units));
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_attention_fwd_sm90(const FwdParams& p, int num_items, cudaStream_t stream) {
  return launch_attention_fwd_sm90_stages<D, kFwd90Stages<D>>(p, num_items, stream);
}

// True when the loaded binary of the sm_90a kernel is real sm_90 code (not the stub of another arch).
template <int D>
bool attention_fwd_sm90_loaded() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, attention_fwd_sm90_kernel<D, kFwd90Stages<D>>) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
}

}  // namespace cad::kernels::detail
