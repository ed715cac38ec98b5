// plan_limits.cpp -- see plan_limits.h.
#include "plan_limits.h"

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

namespace cad::plan {
namespace {

using Wide = unsigned __int128;  // L^2 of any int64 L fits; sums saturate at the limit below

// a * b, or `cap` when the product exceeds it (all operands non-negative).
Wide capped_product(Wide a, Wide b, Wide cap) {
  if (a != 0 && b > cap / a) return cap;
  return std::min(a * b, cap);
}

std::string describe(const char* what, Wide value, Wide cap) {
  char amount[64];
  if (value >= cap) {
    std::snprintf(amount, sizeof amount, "more than 2^126");
  } else {
    std::snprintf(amount, sizeof amount, "%.3g", static_cast<double>(value));
  }
  return std::string("the ") + what + " of this batch (up to " + amount + ") does not fit the cost model's int64 "
         "counters (limit " + std::to_string(kModelLimit) + "); use shorter documents, a shorter context or fewer ranks";
}

}  // namespace

std::string model_overflow(const RankPieces& ranks, int32_t num_servers, const ModelParams& params) {
  // One (doc_id, doc_len) per document: pieces of the same document repeat it.
  std::vector<std::pair<int64_t, int64_t>> docs;
  for (const auto& pieces : ranks) {
    for (const auto& p : pieces) {
      if (p.doc_len < 0 || p.len < 0) return "a piece has a negative length";
      docs.emplace_back(p.doc_id, p.doc_len);
    }
  }
  std::sort(docs.begin(), docs.end());
  docs.erase(std::unique(docs.begin(), docs.end(),
                         [](const auto& a, const auto& b) { return a.first == b.first; }),
             docs.end());
  const Wide cap = Wide{1} << 126;
  const Wide limit = static_cast<Wide>(kModelLimit);
  const Wide q_bytes = static_cast<Wide>(std::max<int64_t>(params.q_round_trip_bytes(), params.q_memory_bytes()));
  const Wide kv_bytes = static_cast<Wide>(params.kv_token_bytes());
  Wide cost = 0, bytes = 0;
  for (const auto& [id, len] : docs) {
    const Wide l = static_cast<Wide>(len);
    // L(L+1)/2 or L^2 <= 2^126 for L < 2^63: no overflow in 128 bits.
    cost += params.causal ? l * (l + 1) / 2 : l * l;
    const Wide servers = std::min<Wide>(static_cast<Wide>(std::max(num_servers, 1)), l);
    bytes += capped_product(l, q_bytes, cap) + capped_product(capped_product(servers, l, cap), kv_bytes, cap);
    if (cost > limit) return describe("attention cost (score entries)", cost, cap);
    if (bytes > limit) return describe("bytes a plan may move", bytes, cap);
  }
  return "";
}

}  // namespace cad::plan
