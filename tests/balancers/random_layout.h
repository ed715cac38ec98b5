// random_layout.h -- random but reproducible piece tables for the balancer tests: documents of any
// length (1, odd, longer than a rank's share), split across ranks by the "host" at random cut points,
// some ranks left empty.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "plan_model.h"

namespace cad::balancer_test {

struct LayoutOptions {
  int32_t ranks = 4;
  int32_t docs = 24;
  int64_t max_doc_len = 5000;
  int32_t empty_ranks = 1;  // the last ones get nothing
  double split_probability = 0.3;
};

inline cad::plan::RankPieces random_layout(uint64_t seed, const LayoutOptions& o) {
  std::mt19937_64 rng(seed);
  auto below = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  const int32_t busy = std::max(1, o.ranks - o.empty_ranks);
  cad::plan::RankPieces ranks(static_cast<size_t>(o.ranks));
  for (int32_t d = 0; d < o.docs; ++d) {
    int64_t len;
    switch (below(6)) {
      case 0: len = 1; break;
      case 1: len = 1 + 2 * below(o.max_doc_len / 8 + 1); break;  // odd
      case 2: len = o.max_doc_len / 2 + below(o.max_doc_len / 2 + 1); break;
      default: len = 1 + below(o.max_doc_len); break;
    }
    const int64_t doc_id = 1000 + 7 * int64_t{d};  // ids need not be dense
    std::vector<int64_t> cuts = {0, len};
    if (len > 2 && below(1000) < static_cast<int64_t>(o.split_probability * 1000)) {
      for (int k = 0, n = 1 + static_cast<int>(below(3)); k < n; ++k) cuts.push_back(1 + below(len - 1));
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      ranks[static_cast<size_t>(below(busy))].push_back({doc_id, len, cuts[i], cuts[i + 1] - cuts[i]});
    }
  }
  return ranks;
}

}  // namespace cad::balancer_test
