// tensor_slices.h -- tensor parallelism as it runs under CAD: the t GPUs of one data-parallel rank hold the
// same tokens and different heads (Hq/t query heads and Hkv/t KV heads each; one KV head, replicated, when
// t > Hkv, as Megatron does). TP index i of every data-parallel rank forms one CAD group: it runs CAD over
// the data group on its own head slice, so its exchanges carry that slice only (bytes per GPU scale as 1/t
// while Hkv % t == 0), and every TP index holds the same plan (the plan depends on the pieces and the slice's
// shape, which is the same on every index): one plan per data group and micro-batch, made once, and the
// simulator prices one TP index for all of them.
#pragma once

#include <cstdint>

#include "cad_balancer_v1.h"
#include "layout.h"
#include "model_shape.h"

namespace cad::simulate {

struct HeadSlice {
  int64_t q_head_begin = 0, q_heads = 0;    // query heads [q_head_begin, q_head_begin + q_heads)
  int64_t kv_head_begin = 0, kv_heads = 0;  // KV heads [kv_head_begin, kv_head_begin + kv_heads)
  bool kv_replicated = false;               // t > Hkv: this KV head is also held by other TP indices
};

// TP index `index` in [0, tp) of a validated layout; throws std::invalid_argument outside it.
HeadSlice head_slice(const Layout& layout, const ModelShape& shape, int64_t index);

// The cost the balancers plan with on TP index `index`: its slice's heads, bf16, causal.
cad_cost_params_v1_t slice_cost(const Layout& layout, const ModelShape& shape, int64_t index, int64_t min_shard_tokens);

// Whether two costs plan alike (every field a balancer reads).
bool same_cost(const cad_cost_params_v1_t& a, const cad_cost_params_v1_t& b);

}  // namespace cad::simulate
