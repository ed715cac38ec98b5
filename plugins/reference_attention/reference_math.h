// reference_math.h -- the numerical oracle of the project: varlen core attention, forward and
// backward, in plain fp32 C++ over raw pointers. No ABI types beyond cad_segment_v1_t, no
// validation: callers (the reference plugin, tests, other backends' tests) pass consistent inputs.
//
// Layouts (row-major, compact):  Q, O, dO, dQ : [tq, hq, d]   K, V, dK, dV : [tk, hkv, d]
//                                LSE : [hq, tq]
// Semantics are those of plugin_api/cad_attention_v1.h: query head h reads KV head h / (hq / hkv);
// segment query i (0-based) sees keys j < visible_keys(segment, i, causal) of its KV range (causal
// masks aligned bottom-right). Every output element is written: O/dQ rows no segment covers are 0
// with LSE -inf, dK/dV rows no segment reads are 0, and dK/dV sum over every segment and query
// head that reads them.
//
// Numerics: fp32 throughout, two-pass stable softmax per query row (max, then exp-sum), backward by
// D_i = rowsum(dO_i * O_i) with the saved LSE. Results are bitwise independent of the thread count:
// every output element is produced by one work item, summing in a fixed order.
#pragma once

#include <cstdint>

#include "cad_common_v1.h"

namespace cad::reference {

struct AttentionBatch {
  int64_t tq = 0;   // query rows (Q, O, dO, dQ)
  int64_t tk = 0;   // key/value rows (K, V, dK, dV)
  int64_t hq = 0;   // query heads; a multiple of hkv
  int64_t hkv = 0;  // key/value heads
  int64_t d = 0;    // head dim
  const cad_segment_v1_t* segments = nullptr;  // in bounds, disjoint in Q, q_len <= kv_len if causal
  int64_t num_segments = 0;
  float softmax_scale = 1.0f;
  bool causal = false;
};

// How many keys (from the start of the segment's KV range) query `i` of `segment` attends to.
inline int64_t visible_keys(const cad_segment_v1_t& segment, int64_t i, bool causal) {
  return causal ? i + 1 + (segment.kv_len - segment.q_len) : segment.kv_len;
}

// num_threads: 0 = hardware concurrency. Threads are started for the call and joined before return.
void attention_forward(const AttentionBatch& batch, const float* q, const float* k, const float* v, float* o,
                       float* lse, int num_threads);

void attention_backward(const AttentionBatch& batch, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* d_q, float* d_k, float* d_v,
                        int num_threads);

}  // namespace cad::reference
