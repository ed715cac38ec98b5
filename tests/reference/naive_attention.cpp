// naive_attention.cpp -- see naive_attention.h.
#include "naive_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cad::testing {
namespace {

// Whether query i of the segment sees key j of its KV range: a dense mask, tested key by key.
// Bottom-right alignment: query i stands at key position p, the last query at the last key.
bool sees(const Problem& pr, const cad_segment_v1_t& s, int64_t i, int64_t j) {
  const int64_t p = (s.kv_len - 1) - (s.q_len - 1 - i);
  if (pr.causal && j > p) return false;
  // Written as distances (p - j, j - p: both well inside int64 for in-range i, j) so that a window at the
  // int64 limits (INT64_MAX = no limit in effect) is tested without overflow.
  if (pr.window_left >= 0 && p - j > pr.window_left) return false;
  if (pr.window_right >= 0 && j - p > pr.window_right) return false;
  return true;
}

double dot(const double* a, const double* b, int64_t n) {
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += a[e] * b[e];
  return sum;
}

// Scaled scores and softmax probabilities of one query row.
struct Row {
  std::vector<double> p;
  double lse = -std::numeric_limits<double>::infinity();
};

Row softmax_row(const Problem& pr, const cad_segment_v1_t& s, int64_t i, int64_t h, const std::vector<double>& q,
                const std::vector<double>& k) {
  const int64_t kvh = h / (pr.hq / pr.hkv);
  const double* query = &q[static_cast<size_t>(((s.q_offset + i) * pr.hq + h) * pr.d)];
  Row row;
  row.p.assign(static_cast<size_t>(s.kv_len), 0.0);  // masked keys keep probability 0
  std::vector<double> scores;
  std::vector<int64_t> seen;
  for (int64_t j = 0; j < s.kv_len; ++j) {
    if (!sees(pr, s, i, j)) continue;
    seen.push_back(j);
    scores.push_back(static_cast<double>(pr.scale) *
                     dot(query, &k[static_cast<size_t>(((s.kv_offset + j) * pr.hkv + kvh) * pr.d)], pr.d));
  }
  if (scores.empty()) return row;
  const double m = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (double x : scores) sum += std::exp(x - m);
  row.lse = m + std::log(sum);
  for (size_t n = 0; n < seen.size(); ++n) row.p[static_cast<size_t>(seen[n])] = std::exp(scores[n] - row.lse);
  return row;
}

}  // namespace

NaiveForward naive_forward(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
                           const std::vector<double>& v) {
  NaiveForward out;
  out.o.assign(static_cast<size_t>(pr.tq * pr.hq * pr.d), 0.0);
  out.lse.assign(static_cast<size_t>(pr.hq * pr.tq), -std::numeric_limits<double>::infinity());
  for (const cad_segment_v1_t& s : pr.segments) {
    for (int64_t h = 0; h < pr.hq; ++h) {
      const int64_t kvh = h / (pr.hq / pr.hkv);
      for (int64_t i = 0; i < s.q_len; ++i) {
        const Row row = softmax_row(pr, s, i, h, q, k);
        const int64_t t = s.q_offset + i;
        out.lse[static_cast<size_t>(h * pr.tq + t)] = row.lse;
        for (size_t j = 0; j < row.p.size(); ++j) {
          for (int64_t e = 0; e < pr.d; ++e) {
            out.o[static_cast<size_t>((t * pr.hq + h) * pr.d + e)] +=
                row.p[j] * v[static_cast<size_t>(((s.kv_offset + static_cast<int64_t>(j)) * pr.hkv + kvh) * pr.d + e)];
          }
        }
      }
    }
  }
  return out;
}

NaiveGradients naive_backward(const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, const std::vector<double>& d_o) {
  NaiveGradients g;
  g.d_q.assign(q.size(), 0.0);
  g.d_k.assign(k.size(), 0.0);
  g.d_v.assign(v.size(), 0.0);
  for (const cad_segment_v1_t& s : pr.segments) {
    for (int64_t h = 0; h < pr.hq; ++h) {
      const int64_t kvh = h / (pr.hq / pr.hkv);
      for (int64_t i = 0; i < s.q_len; ++i) {
        const Row row = softmax_row(pr, s, i, h, q, k);
        const size_t qi = static_cast<size_t>(((s.q_offset + i) * pr.hq + h) * pr.d);
        // dP_j = dO . V_j, then the softmax Jacobian: dS_j = P_j (dP_j - sum_l P_l dP_l).
        std::vector<double> dp(row.p.size());
        double weighted = 0;
        for (size_t j = 0; j < row.p.size(); ++j) {
          const size_t kj = static_cast<size_t>(((s.kv_offset + static_cast<int64_t>(j)) * pr.hkv + kvh) * pr.d);
          dp[j] = dot(&d_o[qi], &v[kj], pr.d);
          weighted += row.p[j] * dp[j];
        }
        for (size_t j = 0; j < row.p.size(); ++j) {
          const size_t kj = static_cast<size_t>(((s.kv_offset + static_cast<int64_t>(j)) * pr.hkv + kvh) * pr.d);
          const double ds = row.p[j] * (dp[j] - weighted) * pr.scale;  // gradient w.r.t. the unscaled Q.K
          for (int64_t e = 0; e < pr.d; ++e) {
            g.d_q[qi + static_cast<size_t>(e)] += ds * k[kj + static_cast<size_t>(e)];
            g.d_k[kj + static_cast<size_t>(e)] += ds * q[qi + static_cast<size_t>(e)];
            g.d_v[kj + static_cast<size_t>(e)] += row.p[j] * d_o[qi + static_cast<size_t>(e)];
          }
        }
      }
    }
  }
  return g;
}

double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double max_diff = 0, max_want = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    if (want[i] == 0.0 || std::isinf(want[i])) {
      if (got[i] != want[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    max_want = std::max(max_want, std::fabs(want[i]));
  }
  return max_diff / std::max(max_want, 1e-30);
}

}  // namespace cad::testing
