// oracle.cpp -- see oracle.h. Written from the formula, row by row, in fp64:
//   s_j = scale * q.k_j over the keys the mask allows, lse = log sum_j exp(s_j), p_j = exp(s_j - lse),
//   o = sum_j p_j v_j; backward: D = dO.o, ds_j = p_j (dO.v_j - D), dq = scale sum_j ds_j k_j,
//   dk_j += scale ds_j q, dv_j += p_j dO.
#include "oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "key_range.h"

namespace cad::conformance {

namespace {

double dot(const double* a, const double* b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Visits every (segment, query head, query row) the batch covers with the row's softmax weights.
// `visit(q_row, head, kv_head, kv_begin, probabilities, lse)` gets the weights of keys
// kv_begin .. kv_begin + probabilities.size() - 1 (the keys the mask allows, always one range).
template <class Visit>
void for_each_row(const AttentionProblem& p, Visit visit) {
  const int64_t group = p.hq / p.hkv;
  std::vector<double> weights;
  for (const cad_segment_v1_t& s : p.segments) {
    for (int64_t i = 0; i < s.q_len; ++i) {
      // Bottom-right alignment: query i stands at key position pos = i + (kv_len - q_len); it sees keys
      // j <= pos when causal, and pos - window_left <= j <= pos + window_right (-1: no limit), exactly
      // for any int64 window (key_range.h).
      const cad::mask::KeyRange keys =
          cad::mask::segment_visible_keys(i, s.q_len, s.kv_len, p.causal, p.window_left, p.window_right);
      const int64_t first = keys.begin;
      const int64_t visible = keys.size();
      const int64_t row = s.q_offset + i;
      for (int64_t h = 0; h < p.hq; ++h) {
        const int64_t hk = h / group;
        const double* q = &p.q[(row * p.hq + h) * p.d];
        weights.assign(static_cast<size_t>(std::max<int64_t>(visible, 0)), 0.0);
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const double* k = &p.k[((s.kv_offset + first + j) * p.hkv + hk) * p.d];
          weights[j] = p.scale * dot(q, k, p.d);
          max_score = std::max(max_score, weights[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < visible; ++j) sum += std::exp(weights[j] - max_score);
        const double lse = visible > 0 ? max_score + std::log(sum) : -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < visible; ++j) weights[j] = std::exp(weights[j] - lse);
        visit(row, h, hk, s.kv_offset + first, weights, lse);
      }
    }
  }
}

double max_abs(const std::vector<double>& values) {
  double m = 0.0;
  for (double x : values) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

double max_error(const std::vector<double>& got, const std::vector<double>& want, double floor, double zero_scale) {
  double max_diff = 0.0, max_want = 0.0;
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    const double diff = std::fabs(got[i] - want[i]);
    max_diff = std::isnan(diff) ? INFINITY : std::max(max_diff, diff);  // NaN: an infinite error
    max_want = std::max(max_want, std::fabs(want[i]));
  }
  if (got.size() != want.size()) return INFINITY;
  if (max_want <= 1e-9 * zero_scale) return max_diff / zero_scale;  // the oracle's tensor is zero
  return max_diff / std::max(max_want, floor);
}

ResultScales result_scales(const AttentionProblem& p, const std::vector<double>& d_o) {
  const auto positive = [](double x) { return x > 0 && std::isfinite(x) ? x : 1.0; };
  const double q = max_abs(p.q), k = max_abs(p.k), v = max_abs(p.v), g = max_abs(d_o);
  const double dot = std::fabs(p.scale) * std::sqrt(static_cast<double>(p.d)) * g * v;
  ResultScales s;
  s.o = positive(v);
  s.d_v = positive(g);
  s.d_q = positive(dot * k);
  s.d_k = positive(dot * q);
  return s;
}

ForwardResult oracle_forward(const AttentionProblem& p) {
  ForwardResult r;
  r.o.assign(static_cast<size_t>(p.tq * p.hq * p.d), 0.0);
  r.lse.assign(static_cast<size_t>(p.hq * p.tq), -std::numeric_limits<double>::infinity());
  for_each_row(p, [&](int64_t row, int64_t h, int64_t hk, int64_t kv_begin, const std::vector<double>& w,
                      double lse) {
    double* o = &r.o[(row * p.hq + h) * p.d];
    for (size_t j = 0; j < w.size(); ++j) {
      const double* v = &p.v[((kv_begin + static_cast<int64_t>(j)) * p.hkv + hk) * p.d];
      for (int64_t c = 0; c < p.d; ++c) o[c] += w[j] * v[c];
    }
    r.lse[h * p.tq + row] = lse;
  });
  return r;
}

BackwardResult oracle_backward(const AttentionProblem& p, const std::vector<double>& d_o) {
  const ForwardResult fwd = oracle_forward(p);
  BackwardResult r;
  r.d_q.assign(static_cast<size_t>(p.tq * p.hq * p.d), 0.0);
  r.d_k.assign(static_cast<size_t>(p.tk * p.hkv * p.d), 0.0);
  r.d_v.assign(static_cast<size_t>(p.tk * p.hkv * p.d), 0.0);
  for_each_row(p, [&](int64_t row, int64_t h, int64_t hk, int64_t kv_begin, const std::vector<double>& w, double) {
    const size_t at = static_cast<size_t>((row * p.hq + h) * p.d);
    const double* q = &p.q[at];
    const double* go = &d_o[at];
    const double big_d = dot(go, &fwd.o[at], p.d);
    double* dq = &r.d_q[at];
    for (size_t j = 0; j < w.size(); ++j) {
      const size_t kv_at = static_cast<size_t>(((kv_begin + static_cast<int64_t>(j)) * p.hkv + hk) * p.d);
      const double ds = w[j] * (dot(go, &p.v[kv_at], p.d) - big_d);
      for (int64_t c = 0; c < p.d; ++c) {
        dq[c] += p.scale * ds * p.k[kv_at + c];
        r.d_k[kv_at + c] += p.scale * ds * q[c];
        r.d_v[kv_at + c] += w[j] * go[c];
      }
    }
  });
  return r;
}

}  // namespace cad::conformance
