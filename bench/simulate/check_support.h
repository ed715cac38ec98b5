// check_support.h -- what the simulator's checks against measured GPU times share: spreads of
// predicted/measured ratios, and a batch's segments as the step model's shards.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cad_attention_v1.h"
#include "step_model.h"

namespace cad::simulate::check {

struct Ratios {
  double min = 0, median = 0, max = 0;
};

inline Ratios spread(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {v.front(), n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.back()};
}

inline double max_over_mean(const std::vector<double>& v) {
  double mx = 0, sum = 0;
  for (double x : v) mx = std::max(mx, x), sum += x;
  return mx / (sum / static_cast<double>(v.size()));
}

// How many ratios lie within 10% of 1.
inline std::ptrdiff_t within_10_percent(const std::vector<double>& v) {
  return std::count_if(v.begin(), v.end(), [](double x) { return x >= 0.9 && x <= 1.1; });
}

// Segments as shards: bottom-right causal, so a segment's queries see kv_len - q_len + 1 .. kv_len keys.
inline std::vector<Shard> segment_shards(const std::vector<cad_segment_v1_t>& segments) {
  std::vector<Shard> out;
  for (const cad_segment_v1_t& s : segments) {
    out.push_back({s.q_len, s.kv_len, s.q_len * s.kv_len - s.q_len * (s.q_len - 1) / 2});
  }
  return out;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace cad::simulate::check
