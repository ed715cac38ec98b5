// sm90/bwd_traits.cuh -- the Hopper backward's constants and shared-memory map: tile sizes, the Q/dO
// pipeline depth per head dim, the producer/consumer register split, where K, V, the Q/dO stages, dS^T,
// dQ, LSE/Delta and the mbarriers sit in shared memory, and the named-barrier ids of its warp roles.
// Every other sm90/bwd_* file works from these.
#pragma once

#include <cstdint>

#include "attention_internal.h"

namespace cad::kernels::detail {

// One block = 128 keys of one work item x one KV head, 384 threads, one block per SM (the roles:
// sm90/bwd_kernel.cuh). STAGES = Q/dO stages; at D=128, 3 (with one dQ buffer, to fit) measured 0-1%
// slower than 2 on H200.
template <int D, int STAGES>
struct BwdWsTraits {
  static_assert(D == 64 || D == 128, "head dims 64 and 128");
  static constexpr int kD = D, kBlockM = 64, kBlockN = kBwdBlockN90, kStages = STAGES, kThreads = 384;
  // dQ buffers in shared memory: two, or one where three Q/dO stages fill shared memory at D=128.
  static constexpr int kDQBuffers = D == 128 && STAGES > 2 ? 1 : 2;
  // At D=64 the two warpgroups' dS^T barriers are separate (each waits only for its own warps).
  static constexpr int kDSBarriers = D == 64 ? 4 : 2;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128*24 + 256*240 <= 64K
  static constexpr uint32_t kKVBytes = kBlockN * kD * 2;          // K (and V): 32 KiB
  static constexpr uint32_t kQBytes = kBlockM * kD * 2;           // one Q (or dO) stage: 16 KiB
  static constexpr uint32_t kDSBytes = kBlockN * kBlockM * 2;     // one dS^T buffer: 16 KiB
  static constexpr uint32_t kDQBytes = kBlockM * 128 * 4;         // one dQ buffer: 64 fp32 columns per warpgroup
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
static_assert(BwdWsTraits<128, 2>::kSmemBytes <= 227 * 1024 && BwdWsTraits<64, 4>::kSmemBytes <= 227 * 1024,
              "shared memory per block");

// Q/dO stages per head dim.
#ifndef CAD_BWD64_STAGES
#define CAD_BWD64_STAGES 2
#endif
template <int D>
constexpr int kBwdStages = D == 128 ? 2 : CAD_BWD64_STAGES;

// Named barriers: Q/dO rows zeroed or K/V loaded (both consumers); dQ buffer b filled (consumers arrive,
// dQ writer waits) and emptied (the other way round); stage s emptied (the consumers arrive, the producer
// waits: kBwdBarStageEmpty + s, one id per stage).
constexpr int kBwdBarConsumers = 2, kBwdBarDQFull = 3, kBwdBarDQEmpty = 5, kBwdBarStageEmpty = 7;
constexpr int kBwdStageBarThreads = 256 + 32;
static_assert(kBwdBarStageEmpty + kBwdStages<128> <= 16 && kBwdBarStageEmpty + kBwdStages<64> <= 16,
              "named barrier ids: one per stage");
constexpr int kBwdDQBarThreads = 256 + 32;

}  // namespace cad::kernels::detail
