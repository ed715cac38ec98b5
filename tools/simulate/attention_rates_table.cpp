// attention_rates_table.cpp -- the measured rate table (planning/rate_table.h) behind the
// AttentionRates interface.
#include <memory>

#include "attention_rates.h"
#include "rate_table.h"

namespace cad::simulate {

namespace {

class TableRates final : public AttentionRates {
 public:
  explicit TableRates(cad::plan::RateTable table) : table_(std::move(table)) {}
  double fwd_tflops(int64_t q, int64_t kv) const override { return table_.fwd_tflops(q, kv); }
  double bwd_tflops(int64_t q, int64_t kv) const override { return table_.bwd_tflops(q, kv); }
  double backward_flop_ratio() const override { return table_.backward_flop_ratio; }
  double bwd_seconds(int64_t q, int64_t kv, bool causal, double fwd_flops, int64_t q_heads) const override {
    return table_.bwd_seconds(q, kv, causal, fwd_flops, q_heads);
  }
  int64_t head_dim() const override { return table_.head_dim; }
  std::string describe() const override {
    return table_.path + " (" + table_.gpu + (table_.has_backward_tiles ? ", backward by tile pairs" : "") + ")";
  }

 private:
  cad::plan::RateTable table_;
};

}  // namespace

std::unique_ptr<AttentionRates> load_attention_rates(const std::string& path) {
  return std::make_unique<TableRates>(cad::plan::load_rate_table(path));
}

}  // namespace cad::simulate
