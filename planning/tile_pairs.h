// tile_pairs.h -- how many (key tile, query step) pairs the Hopper backward kernel runs for one shard,
// in closed form (no loop over tiles: the balancers ask for it inside their binary searches).
//
// The sm_90a backward (kernels/attention_plan.cpp make_backward_plan, kernels/sm90/bwd_kernel.cuh) cuts
// a shard of q queries against kv keys into key tiles of block_n keys (kBwdBlockN90 = 128; the last
// one may be short). For key tile [k0, k0 + keys) it walks the queries that see key k0 -- from
// first = clamp(k0 - (kv - q), 0, q) (causal, bottom-right aligned: query i sees keys <= i + kv - q;
// non-causal: first = 0) to q -- in steps of block_m (64) queries, per KV head with the group's query
// heads looped inside. A PAIR is one such step of ONE query head: (key tile, block_m-query step, query
// head). Counts below are per query head; multiply by the query heads a server runs.
//
// A pair is FULL when no entry of its block_m x block_n square is empty or masked: the tile holds
// block_n keys, the step holds block_m queries, and (causal) the step's first query sees the tile's last
// key. Every other pair is PARTIAL: cut by the causal diagonal, or left partly empty by a short key tile
// or a short last query step. A partial pair costs about as much as a full one plus the masking, for
// less work (docs/simulate.md), which is why the backward's time follows the two counts.
#pragma once

#include <cstdint>

namespace cad::plan {

struct TilePairs {
  int64_t full = 0;
  int64_t partial = 0;
};

// Pairs per query head of a shard of q queries whose keys are kv (causal: the last query sees all kv,
// kv >= q; non-causal: every query sees all kv). block_n must be a multiple of block_m (checked by
// the rate-table reader; here a precondition). q <= 0 or kv <= 0: no pairs.
TilePairs backward_tile_pairs(int64_t q, int64_t kv, bool causal, int64_t block_m, int64_t block_n);

}  // namespace cad::plan
