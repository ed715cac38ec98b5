// batch_recipe.cpp -- see batch_recipe.h.
#include "batch_recipe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <stdexcept>

namespace cad::workload {

namespace {

// splitmix64: tiny, fast, and the same on every platform.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  uint64_t below(uint64_t n) {  // uniform in [0, n), without modulo bias
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next(); while (x >= limit);
    return x % n;
  }

 private:
  uint64_t state_;
};

}  // namespace

std::vector<int64_t> recipe_documents(const std::vector<int64_t>& lengths, int64_t context, uint64_t seed) {
  if (context < 1) throw std::invalid_argument("context must be >= 1 token");
  Random rng(seed);
  std::vector<int64_t> docs;
  docs.reserve(lengths.size() + lengths.size() / 8);
  for (int64_t len : lengths) {
    // Cut at 64K: every full 64K chunk is a "long" document (upsampled twice), the rest a shorter one.
    for (; len >= kRecipeSplitTokens; len -= kRecipeSplitTokens) {
      docs.push_back(kRecipeSplitTokens);
      docs.push_back(kRecipeSplitTokens);
    }
    if (len > 0 && rng.uniform() < 0.9) docs.push_back(len);
  }
  for (size_t i = docs.size(); i > 1; --i) std::swap(docs[i - 1], docs[rng.below(i)]);  // Fisher-Yates
  const double scale = static_cast<double>(context) / static_cast<double>(kRecipeSplitTokens);
  for (int64_t& len : docs) len = std::max<int64_t>(1, std::llround(static_cast<double>(len) * scale));
  return docs;
}

RankPieces pack(const std::vector<int64_t>& docs, int64_t context, int32_t ranks) {
  if (context < 1 || ranks < 1) throw std::invalid_argument("pack: context and ranks must be >= 1");
  RankPieces out(static_cast<size_t>(ranks));
  int32_t rank = 0;
  int64_t room = context;
  for (size_t id = 0; id < docs.size() && rank < ranks; ++id) {
    const int64_t len = docs[id];
    // The part of this document that still fits into the remaining buffers.
    const int64_t space = room + (ranks - 1 - rank) * context;
    const int64_t doc_len = std::min(len, space);
    int64_t offset = 0;
    while (offset < doc_len) {
      const int64_t take = std::min(doc_len - offset, room);
      out[static_cast<size_t>(rank)].push_back({static_cast<int64_t>(id), doc_len, offset, take});
      offset += take;
      room -= take;
      if (room == 0) {
        ++rank;
        room = context;
      }
    }
  }
  return out;
}

RankPieces sample_batch(const std::vector<int64_t>& lengths, int64_t context, int32_t ranks, uint64_t seed) {
  return sample_batch_scaled(lengths, context, context, ranks, seed);
}

RankPieces sample_batch_scaled(const std::vector<int64_t>& lengths, int64_t max_doc_len, int64_t context,
                               int32_t ranks, uint64_t seed, std::vector<int64_t>* stream) {
  if (lengths.empty()) throw std::invalid_argument("sample_batch: no document lengths");
  if (context < 1 || context > (int64_t{1} << 40) || ranks < 1) {
    throw std::invalid_argument("sample_batch: context must be in [1, 2^40] tokens and ranks >= 1");
  }
  if (max_doc_len < 1 || max_doc_len > (int64_t{1} << 40)) {
    throw std::invalid_argument("sample_batch: max_doc_len must be in [1, 2^40] tokens");
  }
  // Each pass lists at most 2 documents per full 64K chunk plus one remainder per length; refuse,
  // before allocating, a stream longer than kMaxRecipeDocuments (lengths are > 0).
  int64_t per_pass = 0;
  for (int64_t len : lengths) {
    per_pass += 2 * (len / kRecipeSplitTokens) + 1;
    if (len < 1 || per_pass > kMaxRecipeDocuments) {
      throw std::invalid_argument("sample_batch: the recipe would cut these lengths into more than " +
                                  std::to_string(kMaxRecipeDocuments) + " documents; use shorter documents");
    }
  }
  std::vector<int64_t> docs = recipe_documents(lengths, max_doc_len, seed);
  // Saturated: a scaled length is at most max_doc_len <= 2^40, so the sum stays below 2^62 + 2^40.
  int64_t total = 0;
  for (int64_t d : docs) total = std::min<int64_t>(total + d, int64_t{1} << 62);
  for (uint64_t pass = 1; total < context * ranks && pass < 1024; ++pass) {
    if (static_cast<int64_t>(docs.size()) > kMaxRecipeDocuments - per_pass) {
      throw std::invalid_argument("sample_batch: filling " + std::to_string(ranks) + " ranks x " +
                                  std::to_string(context) + " tokens needs more than " +
                                  std::to_string(kMaxRecipeDocuments) + " recipe documents");
    }
    for (int64_t d : recipe_documents(lengths, max_doc_len, seed + pass)) {
      docs.push_back(d);
      total = std::min<int64_t>(total + d, int64_t{1} << 62);
    }
  }
  RankPieces out = pack(docs, context, ranks);
  if (stream != nullptr) {
    // The documents pack() laid: up to the last one any rank holds (documents are laid in order).
    int64_t last = -1;
    for (const auto& r : out)
      for (const auto& p : r) last = std::max<int64_t>(last, p.doc_id);
    stream->assign(docs.begin(), docs.begin() + (last + 1));
  }
  return out;
}

std::vector<int64_t> causal_cost_per_rank(const RankPieces& ranks) {
  std::vector<int64_t> cost;
  for (const auto& pieces : ranks) {
    int64_t c = 0;
    for (const auto& p : pieces) {
      const int64_t q = p.len, end = p.offset_in_doc + p.len;
      c += q * end - q * (q - 1) / 2;
    }
    cost.push_back(c);
  }
  return cost;
}

}  // namespace cad::workload
