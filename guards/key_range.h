// key_range.h -- the keys a query sees under the causal mask and a sliding window: the one place that
// rule is computed, exactly, for any int64 window.
//
// A query at key position p (bottom-right aligned: query i of a segment with q_len queries over kv_len keys
// sits at p = i + kv_len - q_len; a task's query at document position p over a document's keys) sees keys j
// in [0, kv_len) with
//   causal:       j <= p
//   window_left:  j >= p - window_left   (-1 = no limit)
//   window_right: j <= p + window_right  (-1 = no limit)
// Written naively, `p + window_right + 1` wraps for window_right = INT64_MAX and `p - window_left` for
// window_left = INT64_MAX with p < 0 (a non-causal segment with q_len > kv_len): the range then comes out
// empty or outside [0, kv_len), and a backend computes zeros with OK or addresses memory it does not own.
// Here every intermediate saturates instead; a saturated value lies beyond an end of [0, kv_len) and the
// clip maps it to exactly that end, so the result is the exact range. Header-only, no dependencies: the
// backends, the balancers' cost model, CAD's layout and the tools all include it.
#pragma once

#include <cstdint>
#include <limits>

namespace cad::mask {

// a + b, or the int64 limit on the side it overflowed to.
inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t out;
  if (!__builtin_add_overflow(a, b, &out)) return out;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

// a - b, or the int64 limit on the side it overflowed to.
inline int64_t saturating_sub(int64_t a, int64_t b) {
  int64_t out;
  if (!__builtin_sub_overflow(a, b, &out)) return out;
  return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

// Keys [begin, end) of [0, kv_len); 0 <= begin <= end <= kv_len, begin == end when none.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The keys a query at position p sees (any p; kv_len >= 0; window_left/right -1 = no limit, else >= 0).
// Both ends never decrease as p grows, so the keys a run of queries [p0, p1] needs are
// [visible_keys(p0).begin, visible_keys(p1).end).
inline KeyRange visible_keys(int64_t p, int64_t kv_len, bool causal, int64_t window_left, int64_t window_right) {
  if (kv_len <= 0) return {};
  int64_t begin = 0;
  int64_t end = kv_len;
  if (causal && p < end) end = p + 1;  // p + 1 <= kv_len: cannot overflow
  if (window_left >= 0) {
    const int64_t first = saturating_sub(p, window_left);
    if (first > begin) begin = first;
  }
  if (window_right >= 0) {
    const int64_t last = saturating_add(saturating_add(p, window_right), 1);
    if (last < end) end = last;
  }
  if (begin > kv_len) begin = kv_len;
  if (end < begin) end = begin;
  return {begin, end};
}

// The same for query i of a segment of q_len queries over kv_len keys (0 <= i < q_len; q_len, kv_len >= 0):
// p = i + kv_len - q_len, computed without overflow (i - q_len is in [-q_len, 0)).
inline KeyRange segment_visible_keys(int64_t i, int64_t q_len, int64_t kv_len, bool causal, int64_t window_left,
                                     int64_t window_right) {
  return visible_keys(kv_len + (i - q_len), kv_len, causal, window_left, window_right);
}

}  // namespace cad::mask
