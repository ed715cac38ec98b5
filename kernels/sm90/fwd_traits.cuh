// sm90/fwd_traits.cuh -- the Hopper forward's constants and shared-memory map: tile sizes, pipeline
// depth, the producer/consumer register split, where Q, the K/V stages and their mbarriers sit in
// shared memory, and the named-barrier ids of the consumer warpgroups (two at D 128, three at D 64).
// Every other sm90/fwd_* file works from these.
#pragma once

#include <cstdint>

#include "attention_internal.h"

namespace cad::kernels::detail {

template <int D, int STAGES>
struct Fwd90Traits {
  static constexpr int kConsumers = fwd90_consumers(D);  // consumer warpgroups of 64 queries each
  static constexpr int kBlockM = fwd_block_m90(D);       // kConsumers x 64 queries
  static constexpr int kBlockN = kFwdBlockN90;           // keys per K/V tile (the plan splits KV on these)
  static constexpr int kStages = STAGES;
  static constexpr int kThreads = 128 * (1 + kConsumers);  // producer warpgroup + the consumers
  static constexpr uint32_t kConsumerWarps = 4 * kConsumers;  // arrivals that free a stage
  // setmaxnreg's split of the 64K registers: 128*40 + 256*232 (two consumers: S 64 + O 64 + P 32 live at D 128);
  // 128*32 + 384*160 (three, at D 64: S 64 + O 32 + P 32).
  static constexpr int kProducerRegs = kConsumers == 2 ? 40 : 32, kConsumerRegs = kConsumers == 2 ? 232 : 160;
  static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= 65536, "register split over 64K");
  static constexpr uint32_t kQBytes = kBlockM * D * 2, kTileBytes = kBlockN * D * 2;
  static constexpr uint32_t kBarrierOffset = kQBytes + 2 * kStages * kTileBytes;
  static constexpr int kBarriers = 2 + 4 * kStages + 4;  // Q, K/V stages, the unit hand-off's two slots
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8 + 2 * 4 + 1024;  // + unit slots, alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "Q and K/V stages over the 227 KiB of shared memory a block may have");
};

// K/V stages in shared memory, 3 at both head dims. D 128: 32 KiB of Q + 3 x 2 x 32 KiB = 224 KiB; 3 stages measured
// 1-6% faster than 2 on long KV, and 0-5% faster than 2 in bench/results/fwd_q_stages_h200x1_2026-12-04_b802893,
// where two Q stages with two K/V stages ran -4.5% to +3.5% of the default and were removed (git history:
// b802893). D 64 (24 KiB of Q + 3 x 2 x 16 KiB): 3 stages ran its forward 0.4-1.5% faster than 4 on all five timed
// cases (bench/results/fwd_kv_stages_h200x1_2026-12-04_38c21de, 5 rounds). -DCAD_FWD90_KV_STAGES=N
// (bench/kernels/bwd_variants.sh's suffix _kN) sets them for an A/B.
#ifndef CAD_FWD90_KV_STAGES
#define CAD_FWD90_KV_STAGES 3
#endif
static_assert(CAD_FWD90_KV_STAGES >= 2, "CAD_FWD90_KV_STAGES: at least 2 (one stage loads while the other is read)");
constexpr int kFwd90Stages = CAD_FWD90_KV_STAGES;

// The tile ranges that need masks, broadcast from lane 0 (-DCAD_FWD90_UNIFORM_MASKS=1; bench/kernels/bwd_variants.sh's
// suffix _m1): they are the same in every lane of a warp (fwd90_masks), but computed per thread ptxas cannot know,
// and wraps each tile's mask branch in a reconvergence barrier (BSSY/BSYNC) instead of a uniform branch. Not yet
// timed.
#ifndef CAD_FWD90_UNIFORM_MASKS
#define CAD_FWD90_UNIFORM_MASKS 0
#endif
static_assert(CAD_FWD90_UNIFORM_MASKS == 0 || CAD_FWD90_UNIFORM_MASKS == 1, "CAD_FWD90_UNIFORM_MASKS: 0 or 1");
constexpr bool kFwd90UniformMasks = CAD_FWD90_UNIFORM_MASKS == 1;

// Named barriers of the consumers: 1 + w = "consumer w may issue its products" (the turn passes w -> w + 1 -> ...
// -> 0), 4 + w = warpgroup w only (ids up to 6: three consumers at most).
constexpr int kTurnBarrier = 1, kWarpgroupBarrier = 4;
// A turn barrier joins two warpgroups, whatever the consumer count: the one whose turn it is (sync) and the one
// passing it on (arrive).
constexpr int kTurnBarrierThreads = 256;

// Shared-memory byte addresses of one block: Q (kBlockM rows), then kStages K tiles, then kStages V
// tiles (each in wgmma's 128-byte-swizzled atoms of 64 head-dim columns, as TMA writes them), then the
// mbarriers: Q full/empty, a full/empty pair per K and per V stage, a full/empty pair per unit slot; then the
// two unit slots (the producer hands each unit's number to the consumers through them: sm90/fwd_scheduler.cuh).
template <typename T>
struct Fwd90Smem {
  uint32_t q, k, v, bars;
  __device__ __forceinline__ explicit Fwd90Smem(uint32_t q_addr)
      : q(q_addr), k(q_addr + T::kQBytes), v(k + T::kStages * T::kTileBytes), bars(q_addr + T::kBarrierOffset) {}
  __device__ __forceinline__ uint32_t q_full() const { return bars; }
  __device__ __forceinline__ uint32_t q_empty() const { return bars + 8; }
  __device__ __forceinline__ uint32_t k_full(int s) const { return bars + 16 + 8 * s; }
  __device__ __forceinline__ uint32_t k_empty(int s) const { return bars + 16 + 8 * (T::kStages + s); }
  __device__ __forceinline__ uint32_t v_full(int s) const { return bars + 16 + 8 * (2 * T::kStages + s); }
  __device__ __forceinline__ uint32_t v_empty(int s) const { return bars + 16 + 8 * (3 * T::kStages + s); }
  __device__ __forceinline__ uint32_t unit_full(int slot) const { return bars + 16 + 8 * (4 * T::kStages + slot); }
  __device__ __forceinline__ uint32_t unit_empty(int slot) const { return bars + 16 + 8 * (4 * T::kStages + 2 + slot); }
  __device__ __forceinline__ uint32_t unit_slot(int slot) const { return bars + 8 * T::kBarriers + 4 * slot; }
  __device__ __forceinline__ uint32_t k_tile(int s) const { return k + s * T::kTileBytes; }
  __device__ __forceinline__ uint32_t v_tile(int s) const { return v + s * T::kTileBytes; }
};

}  // namespace cad::kernels::detail
