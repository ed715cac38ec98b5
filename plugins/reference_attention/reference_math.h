// reference_math.h -- the numerical oracle of the project: varlen core attention, forward and
// backward, in plain fp32 C++ over raw pointers. No ABI types beyond cad_segment_v1_t, no
// validation: callers (the reference plugin, tests, other backends' tests) pass consistent inputs.
//
// Layouts (row-major, compact):  Q, O, dO, dQ : [tq, hq, d]   K, V, dK, dV : [tk, hkv, d]
//                                LSE : [hq, tq]
// Semantics are those of plugin_api/cad_attention_v1.h: query head h reads KV head h / (hq / hkv);
// segment query i (0-based) sees the keys visible_range(...) of its KV range.
//
// Masks, in one frame: query i of a segment sits at key position p = i + (kv_len - q_len) of the
// segment's KV range (bottom-right alignment: the last query lines up with the last key). When the
// segment is a document's query shard [q_begin, q_end) with KV [kv_begin, q_end) of that document,
// p is the query's document position minus kv_begin, so a window in document positions and a window in
// segment positions are the same thing. Query i sees keys j with
//   causal:       j <= p
//   window_left:  j >= p - window_left   (-1 = no limit)
//   window_right: j <= p + window_right  (-1 = no limit)
// clipped to [0, kv_len). Both ends of that range never decrease going down a segment. Every output element is written: O/dQ rows no segment covers are 0
// with LSE -inf, dK/dV rows no segment reads are 0, and dK/dV sum over every segment and query
// head that reads them.
//
// Numerics: fp32 throughout, two-pass stable softmax per query row (max, then exp-sum), backward by
// D_i = rowsum(dO_i * O_i) with the saved LSE. Results are bitwise independent of the thread count:
// every output element is produced by one work item, summing in a fixed order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cad_common_v1.h"
#include "key_range.h"

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
  int64_t window_left = -1;   // sliding window (see the top); -1 = no limit
  int64_t window_right = -1;
};

// Keys [begin, end) of the segment's KV range that a query sees; begin == end when none. Exact for any
// int64 window (key_range.h, the rule every backend and the cost model share).
using KeyRange = cad::mask::KeyRange;

inline KeyRange visible_range(const cad_segment_v1_t& segment, int64_t i, const AttentionBatch& batch) {
  return cad::mask::segment_visible_keys(i, segment.q_len, segment.kv_len, batch.causal, batch.window_left,
                                         batch.window_right);
}

// num_threads: 0 = hardware concurrency. Threads are started for the call and joined before return.
void attention_forward(const AttentionBatch& batch, const float* q, const float* k, const float* v, float* o,
                       float* lse, int num_threads);

void attention_backward(const AttentionBatch& batch, const float* q, const float* k, const float* v,
                        const float* o, const float* lse, const float* d_o, float* d_q, float* d_k, float* d_v,
                        int num_threads);

}  // namespace cad::reference
