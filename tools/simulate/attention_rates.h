// attention_rates.h -- the attention kernel's rate by shard shape, as the step model asks for it. An
// interface, so that the measured table (planning/rate_table.h, configs/calibration/<gpu>.json)
// and the fixed rates of tests and what-if runs are interchangeable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace cad::simulate {

class AttentionRates {
 public:
  virtual ~AttentionRates() = default;
  // TFLOP/s of a shard of q queries whose last query sees kv keys, forward and backward.
  virtual double fwd_tflops(int64_t q, int64_t kv) const = 0;
  virtual double bwd_tflops(int64_t q, int64_t kv) const = 0;
  // Backward FLOPs = ratio x forward FLOPs (2.5 for FlashAttention-style backward).
  virtual double backward_flop_ratio() const = 0;
  // Backward seconds of that shard, whose forward costs fwd_flops over `q_heads` query heads. Default:
  // the FLOP rule, fwd_flops x ratio / the bwd rate. The measured table overrides it with its own rule
  // (RateTable::bwd_seconds: the tile-pair formula when the table has "backward_tiles").
  virtual double bwd_seconds(int64_t q, int64_t kv, bool causal, double fwd_flops, int64_t q_heads) const {
    (void)causal, (void)q_heads;
    return backward_flop_ratio() * fwd_flops / (bwd_tflops(q, kv) * 1e12);
  }
  // The head dim the rates hold for; 0 = any.
  virtual int64_t head_dim() const = 0;
  // One line for reports: where the rates come from.
  virtual std::string describe() const = 0;
};

// The same rate for every shape (tests; `--attention-tflops F,B` what-if runs).
std::unique_ptr<AttentionRates> constant_rates(double fwd_tflops, double bwd_tflops, double backward_flop_ratio);

// The measured table of one GPU kind. Throws std::invalid_argument naming the file and the key.
std::unique_ptr<AttentionRates> load_attention_rates(const std::string& path);

}  // namespace cad::simulate
