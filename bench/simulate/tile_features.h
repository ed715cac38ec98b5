// tile_features.h -- what a server batch's segments cost in the Hopper kernels' own units, to explain
// where the rate table's per-shard prediction misses: query tiles, (query tile, key tile) pairs of the
// forward, (key tile, query block) pairs of the backward, split into pairs with no masked entry ("full")
// and pairs the causal diagonal cuts or a short last tile leaves partly empty ("partial"). Tile sizes are
// the sm90 kernels': forward 128 queries x 128 keys, backward 128 keys x 64 queries (kernels/cad_kernels.h,
// kernels/sm90/bwd_traits.cuh); the walk follows kernels/attention_plan.cpp's work lists (per head;
// multiply by the head count for the grid's units). Causal, bottom-right aligned segments only.
// The backward's pairs are planning/tile_pairs.h's closed form, the one the rate table's
// "backward_tiles" prices.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "cad_common_v1.h"
#include "tile_pairs.h"

namespace cad::simulate::check {

struct TileFeatures {
  int64_t segments = 0;
  int64_t q_rows = 0;
  double fwd_flops_per_head = 0;  // 4 * D * entries, D omitted: entries (q * kv - q(q-1)/2) summed
  int64_t q_tiles = 0;            // sum of ceil(q_len / 128)
  int64_t fwd_full = 0, fwd_partial = 0;  // forward (q tile, k tile) pairs
  int64_t bwd_k_tiles = 0;                 // sum of ceil(kv_len / 128)
  int64_t bwd_full = 0, bwd_partial = 0;  // backward (k tile, 64-query block) pairs
  // The forward's persistent schedule (fwd_schedule below), in key-tile steps of one block:
  int64_t fwd_makespan = 0;   // the busiest of the grid's blocks
  double fwd_mean_load = 0;   // all units' steps / blocks (what a perfect deal would give)
  int64_t fwd_splits = 0;     // query tiles the plan split along KV
  int64_t fwd_kv_stream_tiles = 0;  // FwdSchedule::kv_stream_tiles
};

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The Hopper forward's schedule, as kernels/attention_plan.cpp plans it and kernels/sm90/fwd_scheduler.cuh
// walks it: one item per 128-query tile (cost: its key tiles + 1 for the prologue/epilogue), long items
// split along KV into chunks when that shortens the simulated schedule (+2 per split piece for the partial
// write and merge), items heaviest first, each item once per query head, dealt to `blocks` persistent
// blocks in rounds of alternating direction. Mirrors the planner's constants (kUnitOverheadTiles 1,
// kSplitOverheadTiles 2, kMinSplitKeys 512); the KV-head bands, which reorder units within one wave of
// similar items, are left out. Returns the busiest block's steps, and fills mean load and split count.
struct FwdSchedule {
  int64_t makespan = 0;
  double mean_load = 0;
  int64_t splits = 0;
  // Key tiles read from distinct K/V streams, summed over the waves of the walk: per round of `blocks`
  // units, each (segment, KV head) that some unit of the round reads counts once, with its longest unit.
  // What the round reads from memory when the units sharing a stream hit L2 and different streams do not.
  int64_t kv_stream_tiles = 0;
};

struct FwdItemCost {
  int64_t cost;     // key tiles + overheads
  int64_t blocks;   // key tiles (the planner's sort key)
  int64_t segment;  // which segment's K/V it reads
};

inline int64_t dealt_makespan(const std::vector<FwdItemCost>& items, int64_t heads, int64_t blocks) {
  std::vector<int64_t> load(static_cast<size_t>(blocks), 0);
  int64_t u = 0;
  for (const FwdItemCost& it : items) {
    for (int64_t h = 0; h < heads; ++h, ++u) {
      const int64_t round = u / blocks, pos = u % blocks;
      load[static_cast<size_t>(round & 1 ? blocks - 1 - pos : pos)] += it.cost;
    }
  }
  return *std::max_element(load.begin(), load.end());
}

// Item and query head of unit u (fwd_unit_coords in kernels/sm90/fwd_scheduler.cuh).
inline std::pair<int64_t, int64_t> fwd_unit(int64_t u, int64_t items, int64_t hq, int64_t group, int64_t blocks,
                                            bool bands) {
  if (!bands) return {u / hq, u % hq};
  const int64_t band_items = std::max<int64_t>(1, blocks / group);
  const int64_t band = u / (band_items * hq), band_first = band * band_items;
  const int64_t here = std::min(band_items, items - band_first);
  const int64_t r = u - band * band_items * hq;
  const int64_t kv_head = r / (here * group), r2 = r % (here * group);
  return {band_first + r2 / group, kv_head * group + r2 % group};
}

// key_tiles[i] and segment[i]: forward item i (one 128-query tile) in the planner's order.
inline FwdSchedule fwd_schedule(const std::vector<int64_t>& key_tiles, const std::vector<int64_t>& segment,
                                int64_t heads, int64_t group, int64_t sms) {
  constexpr int64_t kOverhead = 1, kSplitOverhead = 2, kMinChunk = 512 / 128, kMaxUnits = int64_t{1} << 18;
  constexpr int64_t kNoSplit = INT64_MAX;
  FwdSchedule out;
  if (key_tiles.empty()) return out;
  const auto items_for = [&](int64_t chunk, int64_t* splits) {
    std::vector<FwdItemCost> items;
    for (size_t i = 0; i < key_tiles.size(); ++i) {
      const int64_t n = key_tiles[i];
      if (n <= chunk) {
        items.push_back({n + kOverhead, n, segment[i]});
        continue;
      }
      const int64_t pieces = ceil_div64(n, chunk), per = ceil_div64(n, pieces);
      if (splits) ++*splits;
      for (int64_t b = 0; b < n; b += per) {
        const int64_t m = std::min(per, n - b);
        items.push_back({m + kOverhead + kSplitOverhead, m, segment[i]});
      }
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const FwdItemCost& a, const FwdItemCost& b) { return a.blocks > b.blocks; });
    return items;
  };
  const auto span_of = [&](int64_t chunk) {
    std::vector<FwdItemCost> c = items_for(chunk, nullptr);
    if (static_cast<int64_t>(c.size()) * heads > kMaxUnits) return kNoSplit;
    // The planner simulates costs sorted by cost (its own order differs only among equal key tiles).
    std::stable_sort(c.begin(), c.end(), [](const FwdItemCost& a, const FwdItemCost& b) { return a.cost > b.cost; });
    return dealt_makespan(c, heads, std::min<int64_t>(sms, static_cast<int64_t>(c.size()) * heads));
  };
  // The planner's choice (choose_kv_chunk): keep whole items when within 2% of total / SMs, else the
  // coarsest chunk (halving from half the longest item) that is clearly (2%) shorter.
  int64_t chunk = kNoSplit;
  if (static_cast<int64_t>(key_tiles.size()) * heads <= kMaxUnits) {
    int64_t total = 0, longest = 0;
    for (int64_t n : key_tiles) total += (n + kOverhead) * heads, longest = std::max(longest, n);
    int64_t best = span_of(kNoSplit);
    if (best * 49 > ceil_div64(total, sms) * 50) {
      for (int64_t c = longest / 2; c >= kMinChunk; c /= 2) {
        const int64_t m = span_of(c);
        if (m == kNoSplit) break;
        if (m * 50 < best * 49) best = m, chunk = c;
      }
    }
  }
  const std::vector<FwdItemCost> items = items_for(chunk, &out.splits);
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t units = n * heads;
  const int64_t blocks = std::min<int64_t>(sms, units);
  out.makespan = dealt_makespan(items, heads, blocks);
  double sum = 0;
  for (const FwdItemCost& it : items) sum += static_cast<double>(it.cost * heads);
  out.mean_load = sum / static_cast<double>(blocks);
  // The walk's KV-head bands (fwd90_kv_head_bands): with many items, a wave's units share KV heads.
  const int64_t band_items = std::max<int64_t>(1, blocks / group);
  const bool bands = heads / group > 1 && n >= 8 * band_items;
  for (int64_t first = 0; first < units; first += blocks) {
    std::vector<std::pair<std::pair<int64_t, int64_t>, int64_t>> streams;  // ((segment, kv head), tiles)
    for (int64_t u = first; u < std::min(units, first + blocks); ++u) {
      const auto [item, head] = fwd_unit(u, n, heads, group, blocks, bands);
      const FwdItemCost& it = items[static_cast<size_t>(item)];
      const std::pair<int64_t, int64_t> key{it.segment, head / group};
      auto at = std::find_if(streams.begin(), streams.end(), [&](const auto& s) { return s.first == key; });
      if (at == streams.end()) streams.push_back({key, it.blocks});
      else at->second = std::max(at->second, it.blocks);
    }
    for (const auto& s : streams) out.kv_stream_tiles += s.second;
  }
  return out;
}

inline TileFeatures tile_features(const std::vector<cad_segment_v1_t>& segments, int64_t heads, int64_t group,
                                  int64_t sms) {
  constexpr int64_t kFwdM = 128, kFwdN = 128, kBwdN = 128, kBwdM = 64;
  TileFeatures f;
  std::vector<int64_t> key_tiles, item_segment;  // per forward item
  for (const cad_segment_v1_t& s : segments) {
    if (s.q_len <= 0) continue;
    ++f.segments;
    f.q_rows += s.q_len;
    f.fwd_flops_per_head += static_cast<double>(s.q_len * s.kv_len - s.q_len * (s.q_len - 1) / 2);
    const int64_t offset = s.kv_len - s.q_len;  // query i sees keys j <= i + offset
    for (int64_t q0 = 0; q0 < s.q_len; q0 += kFwdM) {
      const int64_t rows = std::min(kFwdM, s.q_len - q0);
      const int64_t kv_end = std::min(s.kv_len, q0 + rows + offset);
      const int64_t tiles = ceil_div64(kv_end, kFwdN);
      // A key tile is full when the tile's first query sees its last key and the tile holds 128 queries.
      const int64_t full = rows == kFwdM ? std::min(tiles, (q0 + offset + 1) / kFwdN) : 0;
      ++f.q_tiles;
      key_tiles.push_back(std::max<int64_t>(1, tiles));
      item_segment.push_back(f.segments);
      f.fwd_full += full;
      f.fwd_partial += tiles - full;
    }
    const cad::plan::TilePairs pairs = cad::plan::backward_tile_pairs(s.q_len, s.kv_len, true, kBwdM, kBwdN);
    f.bwd_k_tiles += ceil_div64(s.kv_len, kBwdN);
    f.bwd_full += pairs.full;
    f.bwd_partial += pairs.partial;
  }
  const FwdSchedule sched = fwd_schedule(key_tiles, item_segment, heads, group, sms);
  f.fwd_makespan = sched.makespan;
  f.fwd_mean_load = sched.mean_load;
  f.fwd_splits = sched.splits;
  f.fwd_kv_stream_tiles = sched.kv_stream_tiles;
  return f;
}

// The feature columns of one batch as markdown table cells (no leading or trailing bar), in the order of
// kFeatureHeader: what --per-rank / --per-batch print for bench/simulate/fit_rank_model.py.
constexpr const char* kFeatureHeader =
    "segments | q rows | kv rows | fwd GFLOP | share q<=128 | share q<=1024 | largest share | q tiles | "
    "fwd full pairs | fwd partial pairs | bwd k tiles | bwd full pairs | bwd partial pairs | "
    "fwd schedule makespan | fwd schedule mean | fwd split tiles | fwd KV stream tiles";

inline std::string feature_rule() {
  std::string rule;
  for (const char* c = kFeatureHeader; *c; ++c)
    if (*c == '|') rule += "---|";
  return rule + "---|";
}

inline std::string feature_cells(const std::vector<cad_segment_v1_t>& segments, int64_t q_rows, int64_t kv_rows,
                                 int64_t heads, int64_t group, int64_t head_dim, int64_t sms) {
  const TileFeatures t = tile_features(segments, heads, group, sms);
  double all = 0, upto128 = 0, upto1024 = 0, top = 0;  // forward entries: all, by segment q_len, largest
  for (const cad_segment_v1_t& s : segments) {
    const double e = static_cast<double>(s.q_len * s.kv_len - s.q_len * (s.q_len - 1) / 2);
    all += e;
    if (s.q_len <= 128) upto128 += e;
    if (s.q_len <= 1024) upto1024 += e;
    top = std::max(top, e);
  }
  const double share = all > 0 ? 1 / all : 0;
  char row[400];
  std::snprintf(row, sizeof row,
                "%lld | %lld | %lld | %.2f | %.3f | %.3f | %.3f | %lld | %lld | %lld | %lld | %lld | %lld | %lld | "
                "%.0f | %lld | %lld |",
                static_cast<long long>(t.segments), static_cast<long long>(q_rows), static_cast<long long>(kv_rows),
                4.0 * static_cast<double>(head_dim * heads) * t.fwd_flops_per_head * 1e-9, upto128 * share,
                upto1024 * share, top * share, static_cast<long long>(t.q_tiles), static_cast<long long>(t.fwd_full),
                static_cast<long long>(t.fwd_partial), static_cast<long long>(t.bwd_k_tiles),
                static_cast<long long>(t.bwd_full), static_cast<long long>(t.bwd_partial),
                static_cast<long long>(t.fwd_makespan), t.fwd_mean_load, static_cast<long long>(t.fwd_splits),
                static_cast<long long>(t.fwd_kv_stream_tiles));
  return row;
}

}  // namespace cad::simulate::check
