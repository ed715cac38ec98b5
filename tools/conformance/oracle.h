// oracle.h -- the kit's own fp64 attention oracle: a deliberately naive, independent implementation of
// the semantics in cad_attention_v1.h (varlen segments, shared KV, GQA, bottom-right causal mask and
// sliding window),
// used to judge every attention backend. Clarity over speed: the kit's batches are small.
#pragma once

#include <cstdint>
#include <vector>

#include "cad_common_v1.h"

namespace cad::conformance {

struct AttentionProblem {
  int64_t tq = 0, tk = 0;   // rows of Q and of K/V
  int64_t hq = 1, hkv = 1;  // query heads, KV heads (hq % hkv == 0)
  int64_t d = 16;           // head dim
  std::vector<cad_segment_v1_t> segments;
  bool causal = true;
  int64_t window_left = -1;  // sliding window (ABI v1.2); -1 = no limit
  int64_t window_right = -1;
  double scale = 0.25;
  // Inputs, row-major: q [tq, hq, d], k and v [tk, hkv, d].
  std::vector<double> q, k, v;
};

struct ForwardResult {
  std::vector<double> o;    // [tq, hq, d]; 0 in rows no segment covers
  std::vector<double> lse;  // [hq, tq]; -inf in rows no segment covers
};

struct BackwardResult {
  std::vector<double> d_q;  // [tq, hq, d]
  std::vector<double> d_k;  // [tk, hkv, d], summed over every segment that reads the row
  std::vector<double> d_v;  // [tk, hkv, d]
};

ForwardResult oracle_forward(const AttentionProblem& problem);
// d_o is [tq, hq, d]; uses the oracle's own forward for O and the softmax.
BackwardResult oracle_backward(const AttentionProblem& problem, const std::vector<double>& d_o);

// How the kit measures a result against the oracle: max|got - want| / max(max|want|, floor), the project's
// relative error -- except where the oracle's tensor is zero (every element below 1e-9 of zero_scale: e.g.
// dQ and dK with window_left = 0, where each query sees only its own key and the gradient is exactly 0).
// A relative measure is then the ratio of a backend's rounding to nothing; the error is measured
// absolutely instead, against zero_scale, the magnitude the tensor's elements would have given these
// inputs (gradient_scales), so a bf16 backend's rounding passes and a wrong nonzero gradient still fails.
double max_error(const std::vector<double>& got, const std::vector<double>& want, double floor, double zero_scale);

// The magnitudes of O, dQ, dK, dV for the problem's inputs: each is a sum over keys of products whose
// sizes the inputs bound (O: max|V|; dV: max|dO|; dQ: scale * sqrt(D) * max|dO| * max|V| * max|K|, the dot
// product dO.V of a dS entry times a key; dK the same with max|Q|). Always > 0.
struct ResultScales {
  double o = 1, d_q = 1, d_k = 1, d_v = 1;
};
ResultScales result_scales(const AttentionProblem& problem, const std::vector<double>& d_o);

}  // namespace cad::conformance
