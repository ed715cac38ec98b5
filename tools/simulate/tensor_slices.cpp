// tensor_slices.cpp -- see tensor_slices.h.
#include "tensor_slices.h"

#include <stdexcept>
#include <string>

namespace cad::simulate {

HeadSlice head_slice(const Layout& layout, const ModelShape& shape, int64_t index) {
  if (index < 0 || index >= layout.tp) {
    throw std::invalid_argument("TP index " + std::to_string(index) + " is outside [0, --tp " +
                                std::to_string(layout.tp) + ")");
  }
  HeadSlice s;
  s.q_heads = heads_per_gpu(layout, shape);
  s.q_head_begin = index * s.q_heads;
  s.kv_heads = kv_heads_per_gpu(layout, shape);
  s.kv_replicated = layout.tp > shape.kv_heads;
  // Replicated: tp / kv_heads consecutive indices share a KV head (their query heads read it).
  s.kv_head_begin = s.kv_replicated ? index / (layout.tp / shape.kv_heads) : index * s.kv_heads;
  return s;
}

cad_cost_params_v1_t slice_cost(const Layout& layout, const ModelShape& shape, int64_t index, int64_t min_shard_tokens) {
  const HeadSlice slice = head_slice(layout, shape, index);
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof cost;
  cost.num_q_heads = static_cast<int32_t>(slice.q_heads);
  cost.num_kv_heads = static_cast<int32_t>(slice.kv_heads);
  cost.head_dim = static_cast<int32_t>(shape.head_dim);
  cost.bytes_per_element = 2;
  cost.causal = 1;
  cost.min_shard_tokens = min_shard_tokens;
  return cost;
}

bool same_cost(const cad_cost_params_v1_t& a, const cad_cost_params_v1_t& b) {
  return a.num_q_heads == b.num_q_heads && a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim &&
         a.bytes_per_element == b.bytes_per_element && a.causal == b.causal &&
         a.min_shard_tokens == b.min_shard_tokens && a.memory_cap_bytes == b.memory_cap_bytes &&
         a.window_flags == b.window_flags && a.window_left == b.window_left && a.window_right == b.window_right;
}

}  // namespace cad::simulate
