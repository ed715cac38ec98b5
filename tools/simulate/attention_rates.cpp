// attention_rates.cpp -- fixed rates (tests, what-if runs).
#include "attention_rates.h"

#include <stdexcept>

namespace cad::simulate {

namespace {

class ConstantRates final : public AttentionRates {
 public:
  ConstantRates(double fwd, double bwd, double ratio) : fwd_(fwd), bwd_(bwd), ratio_(ratio) {}
  double fwd_tflops(int64_t, int64_t) const override { return fwd_; }
  double bwd_tflops(int64_t, int64_t) const override { return bwd_; }
  double backward_flop_ratio() const override { return ratio_; }
  int64_t head_dim() const override { return 0; }
  std::string describe() const override {
    return "fixed: forward " + std::to_string(fwd_) + ", backward " + std::to_string(bwd_) + " TFLOP/s";
  }

 private:
  double fwd_, bwd_, ratio_;
};

}  // namespace

std::unique_ptr<AttentionRates> constant_rates(double fwd_tflops, double bwd_tflops, double backward_flop_ratio) {
  if (!(fwd_tflops > 0) || !(bwd_tflops > 0)) {
    throw std::invalid_argument("attention rates must be > 0 TFLOP/s, got forward " + std::to_string(fwd_tflops) +
                                ", backward " + std::to_string(bwd_tflops));
  }
  if (!(backward_flop_ratio > 0)) throw std::invalid_argument("backward FLOP ratio must be > 0");
  return std::make_unique<ConstantRates>(fwd_tflops, bwd_tflops, backward_flop_ratio);
}

}  // namespace cad::simulate
