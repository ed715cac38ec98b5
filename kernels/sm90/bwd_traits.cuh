// sm90/bwd_traits.cuh -- the Hopper backward's constants and shared-memory map: tile sizes, the Q/dO
// pipeline depth per head dim, the producer/consumer register split, where K, V, the Q/dO stages, dS^T,
// dQ, LSE/Delta and the mbarriers sit in shared memory, and the named-barrier ids of its warp roles.
// Every other sm90/bwd_* file works from these.
#pragma once

#include <cstdint>

#include "attention_internal.h"

namespace cad::kernels::detail {

// Queries per step at D=64: 128 (FlashAttention-3/4's tile there) or 64 (-DCAD_BWD64_QUERIES=64, the tile
// before; kept so that one GPU run can time both, bench/kernels/bwd_variants.sh's variant suffix _q64). At
// D=128 a step is 64 queries: dK, dV, S^T and dP^T in registers leave no room for 128.
#ifndef CAD_BWD64_QUERIES
#define CAD_BWD64_QUERIES 128
#endif
static_assert(CAD_BWD64_QUERIES == 64 || CAD_BWD64_QUERIES == 128, "CAD_BWD64_QUERIES: 64 or 128");

// One block = 128 keys of one work item x one KV head, 384 threads, one block per SM (the roles:
// sm90/bwd_kernel.cuh). STAGES = Q/dO stages; at D=128, 3 (with one dQ buffer, to fit) measured 0-1%
// slower than 2 on H200.
template <int D, int STAGES>
struct BwdWsTraits {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr int kD = D, kBlockM = D == 64 ? CAD_BWD64_QUERIES : 64, kBlockN = kBwdBlockN90;
  static constexpr int kStages = STAGES, kThreads = 384;
  // dQ = dS K: each consumer warpgroup computes one 64 x 64 fp32 tile of it per step, which one depends on
  // the step's shape (sm90/bwd_kernel.cuh's header):
  //   D=128:             columns 64w.. over all 128 keys;
  //   D=64, 64 queries:  all 64 columns over its own 64 keys (kDQOwnKeys: partials, added by the reductions);
  //   D=64, 128 queries: query rows 64w.. over all 128 keys (kDQRowHalves).
  static constexpr bool kDQOwnKeys = D == 64 && kBlockM == 64;
  static constexpr bool kDQRowHalves = kBlockM == 128;
  // dQ buffers in shared memory: two, or one where they would not fit beside the rest (three Q/dO stages at
  // D=128, or the 128-query steps' larger dS^T buffers).
  static constexpr int kDQBuffers = (D == 128 && STAGES > 2) || kBlockM == 128 ? 1 : 2;
  // dS^T barriers: where each warpgroup's dQ reads only its own keys, per warpgroup (each waits only for
  // its own warps), else one per buffer for both.
  static constexpr int kDSBarriers = kDQOwnKeys ? 4 : 2;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128*24 + 256*240 <= 64K
  static constexpr uint32_t kKVBytes = kBlockN * kD * 2;          // K (and V): 32 KiB at D=128
  static constexpr uint32_t kQBytes = kBlockM * kD * 2;           // one Q (or dO) stage: 16 KiB
  static constexpr uint32_t kDSBytes = kBlockN * kBlockM * 2;     // one dS^T buffer: 16 or 32 KiB
  // One dQ buffer: 4 TMA boxes of 64 rows x 32 fp32 columns (8 KiB each), boxes 2w and 2w + 1 warpgroup w's.
  static constexpr int kDQBoxRows = 64;
  static constexpr uint32_t kDQBoxBytes = kDQBoxRows * 32 * 4;
  static constexpr uint32_t kDQBytes = 4 * kDQBoxBytes;
  static constexpr uint32_t kKOff = 0, kVOff = kKVBytes, kQOff = 2 * kKVBytes;
  static constexpr uint32_t kDOOff = kQOff + kStages * kQBytes;
  static constexpr uint32_t kDSOff = kDOOff + kStages * kQBytes;
  static constexpr uint32_t kDQOff = kDSOff + 2 * kDSBytes;
  static constexpr uint32_t kLseOff = kDQOff + kDQBuffers * kDQBytes;
  // Per stage, LSE and Delta of the step's BM queries from the 16-byte boundary at or before the first
  // (kStatLoad floats: a TMA box starts 16-byte aligned, the tile may start at any row), each stage's copy
  // 128-byte aligned in shared memory as TMA requires.
  static constexpr int kStatLoad = kBlockM + 4;
  static constexpr uint32_t kStatLoadBytes = kStatLoad * 4;
  static constexpr uint32_t kStatBytes = (kStatLoadBytes + 127) / 128 * 128;
  static constexpr uint32_t kDeltaOff = kLseOff + kStages * kStatBytes;
  static constexpr uint32_t kBarOff = kDeltaOff + kStages * kStatBytes;
  static constexpr int kSmemBytes = kBarOff + (kStages + kDSBarriers) * 8 + 1024;  // + alignment slack
};
// (Three Q/dO stages at D=128 no longer fit beside the statistics' aligned stages.)
static_assert(BwdWsTraits<128, 2>::kSmemBytes <= 227 * 1024, "shared memory per block");

// Q/dO stages per head dim.
#ifndef CAD_BWD64_STAGES
#define CAD_BWD64_STAGES 2
#endif
template <int D>
constexpr int kBwdStages = D == 128 ? 2 : CAD_BWD64_STAGES;
static_assert(BwdWsTraits<64, kBwdStages<64>>::kSmemBytes <= 227 * 1024,
              "shared memory per block at D=64 (128-query steps fit two Q/dO stages)");

// The consumer's step schedule, chosen at compile time (-DCAD_BWD90_VARIANT=N) so that one GPU run can
// time the schedules side by side (bench/kernels/bwd_variants.sh):
//   0  dQ(j-1) issued with S(j) and stored while S(j) runs; dV/dK(j) as one group at the end of the step;
//      one dQ handshake for both warpgroups (the writer waits for both, both wait for the writer);
//   1  as 0, but each warpgroup hands its half of the dQ buffer to a writer warp of its own (warp 1 + w) on
//      barriers of its own, so that neither waits for the other at the dQ store;
// The default is 1: on one H200 (bench/results/bwd_variants_h200x1_2026-12-02_b6aa63a) it ran the backward
// 3-6% faster than 0 at D=128 and 6-9% at D=64 on every timed case. Two schedules with dQ(j) inside step j,
// FlashAttention-3/4's way, were removed (git history: b6aa63a): the one in their exact order (dV, dQ, dK, dQ
// stored while dK runs) ran 0.98-1.00x of 0 at D=128 and 1.01-1.07x at D=64, below 1 everywhere; the other
// was not timed. Two more, with dV(j) issued before dS^T(j)'s store or right behind dP^T(j), were removed too
// (git history: 123a0da; bench/results/bwd_variants_h200x1_2026-12-02_123a0da): -1.6% to +2.2% of 1, and a
// loss everywhere (it spills). So was a switch that left dV/dK(j) in flight into step j+1, dK reading dS^T from
// shared memory (-DCAD_BWD90_DKV_IN_FLIGHT=1; git history: ee2a059): 0.95-0.99x of 1 on nine of the ten timed
// cases, 1.00x on the tenth (bench/results/bwd_variants_h200x1_2026-12-03_ee2a059). Two more were removed
// after bench/results/bwd_variants_h200x1_2026-12-04_84fc49f (git history: 84fc49f): schedule 2, 1 in
// FlashAttention-3/4's order (dV, dQ once both dS^T are stored, dK, dQ stored while dK runs): 0.95-0.97x of 1 on nine
// of the ten timed cases, 1.00x on D=128's window; and LSE/Delta read into registers ahead of the waits
// (-DCAD_BWD90_STATS_EARLY=1, D=128): 1.00-1.02x of 1, the rounds' noise, and 0.97-1.02x of 2 with 2.
#ifndef CAD_BWD90_VARIANT
#define CAD_BWD90_VARIANT 1
#endif
constexpr int kBwdVariant = CAD_BWD90_VARIANT;
static_assert(kBwdVariant == 0 || kBwdVariant == 1, "CAD_BWD90_VARIANT: 0 or 1");
constexpr bool kBwdDQPerWarpgroup = kBwdVariant == 1;

// Named barriers: Q/dO rows zeroed or K/V loaded (both consumers); dQ buffer b filled (consumers arrive,
// dQ writer waits) and emptied (the other way round) -- per warpgroup w where kBwdDQPerWarpgroup (ids
// + 2b + w), else one pair per buffer (ids + b); stage s emptied (the consumers arrive, the producer
// waits: kBwdBarStageEmpty + s, one id per stage).
constexpr int kBwdBarConsumers = 2, kBwdBarDQFull = 3, kBwdBarDQEmpty = kBwdDQPerWarpgroup ? 7 : 5,
              kBwdBarStageEmpty = kBwdDQPerWarpgroup ? 11 : 7;
constexpr int kBwdStageBarThreads = 256 + 32;
static_assert(kBwdBarStageEmpty + kBwdStages<128> <= 16 && kBwdBarStageEmpty + kBwdStages<64> <= 16,
              "named barrier ids: one per stage");
constexpr int kBwdDQBarThreads = (kBwdDQPerWarpgroup ? 128 : 256) + 32;
// The dQ barrier ids of buffer b as warpgroup wg uses them.
__host__ __device__ constexpr int bwd_dq_bar(int base, int b, int wg) {
  return kBwdDQPerWarpgroup ? base + 2 * b + wg : base + b;
}

}  // namespace cad::kernels::detail
