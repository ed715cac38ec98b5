// model_shape.h -- the transformer shape `cad simulate` prices: what one token costs in the linear
// (O(tokens)) part of a layer, and the attention shape each GPU sees after tensor parallelism.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cad::simulate {

struct ModelShape {
  std::string name;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // GQA: heads % kv_heads == 0
  int64_t head_dim = 0;
  int64_t mlp = 0;       // SwiGLU intermediate size (three hidden x mlp matrices)
  int64_t vocab = 0;     // output projection (0: not counted)

  // Forward FLOPs of one token through one layer's matrix products: Q/K/V and output projections and
  // the SwiGLU MLP, 2 FLOPs per multiply-add, all of them across the whole tensor-parallel group.
  double linear_flops_per_token_layer() const;
  // Forward FLOPs of one token through the output projection (logits).
  double head_flops_per_token() const;
};

// The presets: "llama-8b" (Llama-3-8B) and "34b" (CodeLlama-34B's shape). Throws std::invalid_argument
// naming the preset and the known ones.
ModelShape model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

// Checks every field (>= 1, heads % kv_heads == 0); throws std::invalid_argument naming the field.
void validate(const ModelShape& shape);

}  // namespace cad::simulate
