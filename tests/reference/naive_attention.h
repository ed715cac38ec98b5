// naive_attention.h -- the tests' own fp64 attention, written straight from the formula, one query
// row at a time, sharing no code with the plugin. Backward uses the softmax Jacobian
// (dS = P * (dP - rowsum(P * dP))), not the plugin's D_i = rowsum(dO * O) shortcut, so the two
// formulations check each other.
#pragma once

#include <cstdint>
#include <vector>

#include "cad_common_v1.h"

namespace cad::testing {

struct Problem {
  int64_t tq = 0, tk = 0, hq = 1, hkv = 1, d = 1;
  std::vector<cad_segment_v1_t> segments;
  float scale = 1.0f;
  bool causal = false;
  int64_t window_left = -1;   // sliding window, PyTorch's window_size; -1 = no limit
  int64_t window_right = -1;
};

struct NaiveForward {
  std::vector<double> o;    // [tq, hq, d]; rows no segment covers: 0
  std::vector<double> lse;  // [hq, tq]; rows no segment covers: -inf
};

struct NaiveGradients {
  std::vector<double> d_q, d_k, d_v;
};

NaiveForward naive_forward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v);

NaiveGradients naive_backward(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<double>& d_o);

// max |got - want| / max(max |want|, tiny). Where `want` is exactly 0 or -inf (rows no segment
// touches), `got` must be identical; a NaN or a mismatch there gives +inf.
double relative_error(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace cad::testing
