// test_batch.cpp -- see test_batch.h.
#include "test_batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>

namespace cad_test {

namespace {
// Uniform integer in [lo, hi], the same on every rank and platform (std distributions are not).
int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}
float uniform_float(std::mt19937_64& rng) {
  return static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}
template <class T>
void shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(i) - 1))]);
}
}  // namespace

std::vector<int64_t> GlobalBatch::global_rows(int32_t rank) const {
  std::vector<int64_t> rows;
  for (const cad_piece_v1_t& p : pieces[static_cast<size_t>(rank)]) {
    const int64_t first = doc(p.doc_id).first_row + p.offset_in_doc;
    for (int64_t i = 0; i < p.len; ++i) rows.push_back(first + i);
  }
  return rows;
}

const Document& GlobalBatch::doc(int64_t id) const {
  for (const Document& d : docs) {
    if (d.id == id) return d;
  }
  throw std::out_of_range("no document " + std::to_string(id));
}

GlobalBatch make_batch(const BatchSpec& spec) {
  std::mt19937_64 rng(spec.seed * 0x9E3779B97F4A7C15ull + 12345);
  GlobalBatch b;
  b.world = spec.world;
  b.hq = spec.hq;
  b.hkv = spec.hkv;
  b.d = spec.d;
  b.pieces.resize(static_cast<size_t>(spec.world));

  // Documents: a mix of length-1, short, medium and a few longer than one rank's share.
  const int64_t target = spec.tokens_per_rank * spec.world;
  int64_t id = 1000 + uniform(rng, 0, 50);
  while (b.total_tokens < target) {
    const int64_t kind = uniform(rng, 0, 9);
    const int64_t long_len = std::max<int64_t>(2 * spec.tokens_per_rank, 152);  // longer than a rank's share
    int64_t len = kind < 2   ? 1
                  : kind < 6 ? uniform(rng, 2, 40)
                  : kind < 9 ? uniform(rng, 41, 150)
                             : uniform(rng, 151, long_len);
    len = std::min(len, target - b.total_tokens + 1);
    b.docs.push_back(Document{id, len, b.total_tokens});
    b.total_tokens += len;
    id += uniform(rng, 1, 5);  // ids are not indices
  }

  // Pieces: each document cut at up to 3 random points; every piece goes to a random rank. One rank
  // may be left empty on purpose.
  const int32_t empty_rank =
      spec.allow_empty_rank && spec.world > 1 && uniform(rng, 0, 1) == 1 ? static_cast<int32_t>(uniform(rng, 0, spec.world - 1)) : -1;
  bool split_somewhere = false;
  for (const Document& doc : b.docs) {
    std::vector<int64_t> cuts = {0, doc.len};
    const int64_t extra = doc.len > 1 ? uniform(rng, 0, 3) : 0;
    for (int64_t c = 0; c < extra; ++c) cuts.push_back(uniform(rng, 1, doc.len - 1));
    if (!split_somewhere && doc.len > 1) cuts.push_back(doc.len / 2);  // at least one split document
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    split_somewhere = split_somewhere || cuts.size() > 2;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      int32_t rank = static_cast<int32_t>(uniform(rng, 0, spec.world - 1));
      if (rank == empty_rank) rank = (rank + 1) % spec.world;
      b.pieces[static_cast<size_t>(rank)].push_back(cad_piece_v1_t{doc.id, doc.len, cuts[i], cuts[i + 1] - cuts[i]});
    }
  }
  for (auto& rank_pieces : b.pieces) shuffle(rank_pieces, rng);

  const auto fill = [&](std::vector<float>& t, int64_t width) {
    t.resize(static_cast<size_t>(b.total_tokens * width));
    for (float& x : t) x = uniform_float(rng);
  };
  fill(b.q, b.hq * b.d);
  fill(b.k, b.hkv * b.d);
  fill(b.v, b.hkv * b.d);
  fill(b.d_o, b.hq * b.d);
  return b;
}

std::vector<float> take_rows(const std::vector<float>& global, int64_t width, const std::vector<int64_t>& rows) {
  std::vector<float> out;
  out.reserve(rows.size() * static_cast<size_t>(width));
  for (int64_t r : rows) out.insert(out.end(), global.begin() + r * width, global.begin() + (r + 1) * width);
  return out;
}

std::vector<float> take_columns(const std::vector<float>& global, int64_t heads, int64_t total,
                                const std::vector<int64_t>& cols) {
  std::vector<float> out(static_cast<size_t>(heads) * cols.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (size_t c = 0; c < cols.size(); ++c) out[static_cast<size_t>(h) * cols.size() + c] = global[static_cast<size_t>(h * total + cols[c])];
  }
  return out;
}

uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // finite inputs only (the tests' values are in [-1, 1])
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, 4);
  return x;
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace cad_test
