// model_shape.cpp -- presets and per-token FLOPs of the linear part of a layer.
#include "model_shape.h"

#include <stdexcept>

namespace cad::simulate {

double ModelShape::linear_flops_per_token_layer() const {
  const double h = static_cast<double>(hidden);
  const double d = static_cast<double>(head_dim);
  const double qkv = h * static_cast<double>(heads + 2 * kv_heads) * d;
  const double out = static_cast<double>(heads) * d * h;
  const double mlp_mults = 3.0 * h * static_cast<double>(mlp);  // gate, up, down
  return 2.0 * (qkv + out + mlp_mults);
}

double ModelShape::head_flops_per_token() const {
  return 2.0 * static_cast<double>(hidden) * static_cast<double>(vocab);
}

std::vector<std::string> model_preset_names() { return {"llama-8b", "34b"}; }

ModelShape model_preset(const std::string& name) {
  // Public configs of the models DistCA evaluates (Llama-3-8B; CodeLlama-34B for the 34B shape).
  if (name == "llama-8b") return {"llama-8b", 32, 4096, 32, 8, 128, 14336, 128256};
  if (name == "34b") return {"34b", 48, 8192, 64, 8, 128, 22016, 32000};
  std::string known;
  for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown model preset '" + name + "' (known: " + known + ")");
}

void validate(const ModelShape& s) {
  const struct {
    const char* key;
    int64_t value;
  } fields[] = {{"layers", s.layers}, {"hidden", s.hidden}, {"heads", s.heads},
                {"kv_heads", s.kv_heads}, {"head_dim", s.head_dim}, {"mlp", s.mlp}};
  for (const auto& f : fields) {
    if (f.value < 1) {
      throw std::invalid_argument(std::string("model shape: ") + f.key + " must be >= 1, got " +
                                  std::to_string(f.value));
    }
  }
  if (s.vocab < 0) throw std::invalid_argument("model shape: vocab must be >= 0, got " + std::to_string(s.vocab));
  if (s.heads % s.kv_heads != 0) {
    throw std::invalid_argument("model shape: heads (" + std::to_string(s.heads) + ") must be a multiple of kv_heads (" +
                                std::to_string(s.kv_heads) + ")");
  }
}

}  // namespace cad::simulate
