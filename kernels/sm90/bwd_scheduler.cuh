// sm90/bwd_scheduler.cuh -- which (work item, KV head) each block of the Hopper backward runs: one block
// per unit, as many blocks as units (the hardware starts them in index order, an SM taking the next as it
// frees up). Whether the KV heads of an item are neighbours (heads_inner) is chosen on the host, by
// simulating both orders over the plan: bwd_heads_inner in attention_api.cpp. The work items themselves
// (key tiles, heaviest first) come from the host plan (attention_plan.cpp).
#pragma once

#include "attention_internal.h"

namespace cad::kernels::detail {

// Block -> (work item, KV head). The hardware starts blocks in index order; with heads_inner the KV heads
// of one item are neighbours, so the items' heaviest-first order holds across all heads (with the items
// outermost, each head's light tail items would start before the next head's heavy ones: at dense causal 4K
// the last SM then finishes after 1.6x the mean work).
struct BwdUnit {
  int item, kv_head;
};
__device__ __forceinline__ BwdUnit bwd_unit(const BwdParams& p, int num_items, int heads_inner) {
  const int hkv = p.hq / p.group;
  if (heads_inner) return {static_cast<int>(blockIdx.x) / hkv, static_cast<int>(blockIdx.x) % hkv};
  return {static_cast<int>(blockIdx.x) % num_items, static_cast<int>(blockIdx.x) / num_items};
}

}  // namespace cad::kernels::detail
