// tile_pairs.cpp -- see tile_pairs.h.
#include "tile_pairs.h"

#include <algorithm>

namespace cad::plan {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The pairs of key tile t alone (causal): its query steps start at `first`; the step whose first query
// is first + j*m sees the tile's last key iff j*m >= cut, so the first ceil(cut / m) steps are cut by
// the diagonal, and the last step is partial when it holds fewer than m queries (counted once if it is
// also cut: min() caps). A short key tile leaves every step partial.
TilePairs one_tile(int64_t t, int64_t q, int64_t kv, int64_t m, int64_t n) {
  const int64_t offset = kv - q, k0 = t * n, keys = std::min(n, kv - k0);
  const int64_t first = std::clamp<int64_t>(k0 - offset, 0, q);
  const int64_t steps = ceil_div(q - first, m);
  const int64_t cut = std::max<int64_t>(0, k0 + keys - 1 - offset - first);
  const int64_t short_step = (q - first) % m != 0 ? 1 : 0;
  const int64_t full = keys < n ? 0 : steps - std::min(steps, ceil_div(cut, m) + short_step);
  return {full, steps - full};
}

}  // namespace

TilePairs backward_tile_pairs(int64_t q, int64_t kv, bool causal, int64_t block_m, int64_t block_n) {
  if (q <= 0 || kv <= 0) return {};
  const int64_t m = block_m, n = block_n;
  const int64_t tiles = ceil_div(kv, n);
  if (!causal) {
    const int64_t full = (kv / n) * (q / m);
    return {full, tiles * ceil_div(q, m) - full};
  }
  // Causal. Tiles [0, a) lie wholly left of the diagonal (their last key is seen by query 0): every
  // step of all q queries, full except a short last one.
  const int64_t offset = kv - q;
  const int64_t a = std::min(tiles, (offset + 1) / n);
  TilePairs out;
  out.full = a * (q / m);
  out.partial = a * (ceil_div(q, m) - q / m);
  // Tile a may straddle query 0's diagonal and tile tiles-1 may be short: priced one by one. Between
  // them, tiles (a, tiles - 1) start right of the diagonal (k0 > offset) and hold n keys: each starts at
  // query k0 - offset, so it runs ceil((kv - k0) / m) steps (an arithmetic sequence, n / m fewer per
  // tile), of which ceil((n - 1) / m) are cut by the diagonal and one more is short when kv % m != 0
  // (the same for all: m divides n); kv - k0 > n leaves more steps than that.
  const auto add = [&](const TilePairs& p) { out.full += p.full, out.partial += p.partial; };
  if (a < tiles) add(one_tile(a, q, kv, m, n));
  if (tiles - 1 > a) add(one_tile(tiles - 1, q, kv, m, n));
  const int64_t lo = a + 1, hi = tiles - 1;  // the bulk: [lo, hi)
  if (hi > lo) {
    const int64_t count = hi - lo;
    const int64_t steps = count * ceil_div(kv, m) - (n / m) * ((lo + hi - 1) * count / 2);  // (lo+hi-1)*count is even
    const int64_t partial_each = ceil_div(n - 1, m) + (kv % m != 0 ? 1 : 0);
    out.partial += count * partial_each;
    out.full += steps - count * partial_each;
  }
  return out;
}

}  // namespace cad::plan
