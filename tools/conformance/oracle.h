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

}  // namespace cad::conformance
