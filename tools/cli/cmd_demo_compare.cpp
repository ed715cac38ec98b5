// cmd_demo_compare.cpp -- see demo_compare.h.
#include "demo_compare.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cad::demo {

std::vector<double> local_agreement(const std::vector<BalancerRun>& runs) {
  std::vector<double> out;
  if (runs.empty()) return out;
  const BalancerRun& base = runs.front();
  for (const Tensor& t : base.outputs) out.push_back(t.max_abs());
  for (size_t b = 1; b < runs.size(); ++b) {
    for (int i = 0; i < kNumOutputs; ++i) {
      const std::vector<float>& x = base.outputs[static_cast<size_t>(i)].data;
      const std::vector<float>& y = runs[b].outputs[static_cast<size_t>(i)].data;
      double worst = x.size() == y.size() ? 0.0 : std::numeric_limits<double>::infinity();
      for (size_t e = 0; e < std::min(x.size(), y.size()); ++e) {
        const double d = std::fabs(static_cast<double>(x[e]) - static_cast<double>(y[e]));
        // Identical values (infinities included) agree; a NaN or a lone infinity never does.
        if (x[e] == y[e]) continue;
        worst = std::isfinite(d) ? std::max(worst, d) : std::numeric_limits<double>::infinity();
      }
      out.push_back(worst);
    }
  }
  return out;
}

Verdict judge(const std::vector<std::vector<double>>& per_rank, size_t runs, double tolerance) {
  Verdict v;
  std::array<double, kNumOutputs> scale{};
  for (const auto& mine : per_rank) {
    for (int i = 0; i < kNumOutputs; ++i) scale[i] = std::max(scale[i], mine[static_cast<size_t>(i)]);
  }
  for (size_t b = 1; b < runs; ++b) {
    std::array<double, kNumOutputs> diff{};
    for (const auto& mine : per_rank) {
      for (int i = 0; i < kNumOutputs; ++i) {
        const double d = mine[b * kNumOutputs + static_cast<size_t>(i)];
        diff[i] = std::isnan(d) ? d : std::max(diff[i], d);
      }
    }
    std::array<double, kNumOutputs> rel{};
    for (int i = 0; i < kNumOutputs; ++i) {
      // An all-zero baseline (e.g. no tokens anywhere) agrees only with an exact zero difference.
      rel[i] = diff[i] == 0.0 ? 0.0 : (scale[i] > 0 ? diff[i] / scale[i] : std::numeric_limits<double>::infinity());
      if (std::isnan(diff[i])) rel[i] = diff[i];
      v.worst = std::isnan(rel[i]) ? rel[i] : std::max(v.worst, rel[i]);
      if (!(rel[i] <= tolerance)) v.agree = false;
    }
    v.relative.push_back(rel);
  }
  return v;
}

void inject_difference(BalancerRun& run, double relative) {
  Tensor& o = run.outputs.front();
  if (o.data.empty()) return;
  o.data[0] += static_cast<float>(relative * std::max(o.max_abs(), 1e-30));
}

}  // namespace cad::demo
