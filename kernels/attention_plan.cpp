// attention_plan.cpp -- host code that turns a segment table into the kernels' work lists: forward
// query tiles (split along KV when there are too few of them to fill the GPU), backward key tiles,
// the rows no segment covers, and the workspace layout. Pure C++: no CUDA call here.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "cad_kernels.h"

namespace cad::kernels {
namespace {

constexpr size_t kAlign = 256;
// Bytes after each backward statistic ([hq, tq] fp32) that a copy may read past its last value: the sm_90a
// backward reads kStatLoad = BM + 4 floats from a 16-byte boundary (BM = 64: 272 bytes; sm90/bwd_traits.cuh).
constexpr size_t kStatPadBytes = 1024;
constexpr int kFwdBlocksPerSm = 2;     // what the forward kernel's registers and shared memory allow at D=128
constexpr int64_t kMinSplitKeys = 512;  // a KV split shorter than this costs more to merge than it saves

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows of [0, total) that none of `ranges` covers, merged and in order.
std::vector<RowRange> gaps(std::vector<RowRange> ranges, int64_t total) {
  std::sort(ranges.begin(), ranges.end(), [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  std::vector<RowRange> out;
  int64_t covered_to = 0;
  for (const RowRange& r : ranges) {
    if (r.begin > covered_to) out.push_back({covered_to, r.begin});
    covered_to = std::max(covered_to, r.end);
  }
  if (covered_to < total) out.push_back({covered_to, total});
  return out;
}


// Cost units of the schedule simulation: one key tile of one item. A work unit also pays a fixed
// prologue/epilogue, and a split piece writes fp32 partials that a merge pass reads back.
constexpr int64_t kUnitOverheadTiles = 1;
constexpr int64_t kSplitOverheadTiles = 2;
constexpr int64_t kMaxSimulatedUnits = int64_t{1} << 18;  // beyond this there is parallelism to spare

// Finishing time of the busiest of `slots` workers when the units (each item once per head, heaviest
// first) are dealt out in rounds that alternate direction -- how the persistent Hopper kernel walks
// them, and close to how the hardware hands out the portable kernel's blocks.
int64_t simulated_makespan(const std::vector<int64_t>& costs_desc, int64_t heads, int64_t slots) {
  std::vector<int64_t> load(static_cast<size_t>(slots), 0);
  int64_t u = 0;
  for (int64_t cost : costs_desc) {
    for (int64_t h = 0; h < heads; ++h, ++u) {
      const int64_t round = u / slots, pos = u % slots;
      load[static_cast<size_t>(round & 1 ? slots - 1 - pos : pos)] += cost;
    }
  }
  return *std::max_element(load.begin(), load.end());
}

// The KV chunk (in key tiles) that gives the shortest simulated schedule; "no split" when nothing beats it.
int64_t choose_kv_chunk(const std::vector<FwdItem>& tiles, int64_t block_n, int64_t heads, int64_t slots) {
  std::vector<int64_t> tile_counts;
  int64_t longest = 0;
  for (const FwdItem& it : tiles) {
    tile_counts.push_back(std::max<int64_t>(1, ceil_div(it.kv_end - it.kv_begin, block_n)));
    longest = std::max(longest, tile_counts.back());
  }
  const int64_t no_split = std::numeric_limits<int64_t>::max();
  if (tiles.empty() || static_cast<int64_t>(tiles.size()) * heads > kMaxSimulatedUnits) return no_split;
  const int64_t min_chunk = ceil_div(kMinSplitKeys, block_n);
  auto makespan_for = [&](int64_t chunk) {
    std::vector<int64_t> costs;
    for (int64_t n : tile_counts) {
      if (n <= chunk) {
        costs.push_back(n + kUnitOverheadTiles);
        continue;
      }
      const int64_t splits = ceil_div(n, chunk), per_split = ceil_div(n, splits);
      for (int64_t b = 0; b < n; b += per_split) {
        costs.push_back(std::min(per_split, n - b) + kUnitOverheadTiles + kSplitOverheadTiles);
      }
    }
    if (static_cast<int64_t>(costs.size()) * heads > kMaxSimulatedUnits) return no_split;
    std::sort(costs.begin(), costs.end(), std::greater<>());
    return simulated_makespan(costs, heads, slots);
  };
  int64_t best_chunk = no_split, best = makespan_for(no_split);
  // Splitting only adds work, so no schedule beats total / slots: when the whole batch is already within 2%
  // of that, stop here (large batches; this keeps planning a dense 64K batch well under a millisecond).
  int64_t total = 0;
  for (int64_t n : tile_counts) total += (n + kUnitOverheadTiles) * heads;
  const int64_t bound = ceil_div(total, slots);
  if (best * 49 <= bound * 50) return no_split;
  for (int64_t chunk = longest / 2; chunk >= min_chunk; chunk /= 2) {
    const int64_t m = makespan_for(chunk);
    if (m == no_split) break;  // too many pieces to simulate: finer chunks only get worse
    // Prefer fewer splits unless the schedule gets clearly (2%) shorter.
    if (best == no_split || m * 50 < best * 49) {
      best = m;
      best_chunk = chunk;
    }
  }
  return best_chunk;
}

// The problem the kernels run for these segments: a window that hides no key is dropped (the call is then
// exactly the unwindowed one, on the Hopper kernels where asked for); one that hides any keeps `hopper` too
// (both wgmma kernels mask windows, both head dims, causal or not).
AttentionProblem kernel_problem(const AttentionProblem& problem, const Segment* segments, int64_t num_segments) {
  AttentionProblem pr = problem;
  if (!window_hides_keys(problem, segments, num_segments)) pr.window_left = pr.window_right = -1;
  return pr;
}

}  // namespace

bool head_dim_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

bool window_hides_keys(const AttentionProblem& problem, const Segment* segments, int64_t num_segments) {
  if (!problem.windowed()) return false;
  for (int64_t i = 0; i < num_segments; ++i) {
    const Segment& s = segments[i];
    if (s.q_len <= 0 || s.kv_len <= 0) continue;  // no query to hide a key from, or no key to hide
    if (problem.window_left >= 0 && problem.window_left < s.kv_len - 1) return true;
    if (!problem.causal && problem.window_right >= 0 && problem.window_right < s.q_len - 1) return true;
  }
  return false;
}

ForwardPlan make_forward_plan(const AttentionProblem& problem, const Segment* segments, int64_t num_segments,
                              int num_sms) {
  ForwardPlan plan;
  plan.max_blocks = std::max(1, num_sms);
  // The Hopper forward masks windows (sm90/fwd_softmax.cuh): its items are the same query tiles with the same
  // key ranges [kv_begin, kv_end) (128 x 128 tiles instead of 64 x 64), and it masks the partial blocks.
  plan.problem = kernel_problem(problem, segments, num_segments);
  const AttentionProblem& pr = plan.problem;
  plan.block_m = fwd_block_m(pr);
  const int64_t block_m = plan.block_m;
  const int64_t left = pr.window_left, right = pr.window_right;
  std::vector<RowRange> q_ranges;
  std::vector<FwdItem> tiles;
  for (int64_t i = 0; i < num_segments; ++i) {
    const Segment& s = segments[i];
    if (s.q_len <= 0) continue;
    q_ranges.push_back({s.q_offset, s.q_offset + s.q_len});
    const int64_t offset = pr.causal || pr.windowed() ? s.kv_len - s.q_len : 0;
    for (int64_t q0 = 0; q0 < s.q_len; q0 += block_m) {
      const int64_t rows = std::min<int64_t>(block_m, s.q_len - q0);
      // The tile's last query sees keys up to q0 + rows - 1 + offset (+ window_right); its first one keys
      // from q0 + offset - window_left on: the keys outside [kv_begin, kv_end) get no tile at all.
      int64_t kv_end = pr.causal ? std::min(s.kv_len, q0 + rows + offset) : s.kv_len;
      if (right >= 0) kv_end = std::min(kv_end, q0 + rows - 1 + offset + right + 1);
      const int64_t kv_begin = left >= 0 ? std::clamp<int64_t>(q0 + offset - left, 0, s.kv_len) : 0;
      kv_end = std::max(kv_begin, kv_end);
      FwdItem item{};
      item.q_row = s.q_offset + q0;
      item.kv_row = s.kv_offset;
      item.q_rows = static_cast<int32_t>(rows);
      item.q_index = static_cast<int32_t>(q0);
      item.causal_offset = static_cast<int32_t>(offset);
      item.kv_begin = static_cast<int32_t>(kv_begin);
      item.kv_end = static_cast<int32_t>(kv_end);
      item.partial_slot = -1;
      tiles.push_back(item);
    }
  }
  plan.uncovered = gaps(q_ranges, pr.tq);

  // Split long KV ranges into chunks of at most `chunk` key tiles when that shortens the schedule: with
  // short queries against long KV (CAD's shards) there are too few, too uneven items to keep every SM
  // busy to the end. Each candidate is priced by simulating the kernel's schedule; splitting costs a
  // partial write and a merge, so it is only chosen where it pays.
  const int64_t block_n = fwd_block_n(pr);
  const int64_t heads = std::max(1, pr.hq);
  const int64_t slots = std::max(1, num_sms) * static_cast<int64_t>(pr.hopper ? 1 : kFwdBlocksPerSm);
  const int64_t chunk = choose_kv_chunk(tiles, block_n, heads, slots);
  const auto blocks_of = [&](const FwdItem& it) { return std::max<int64_t>(1, ceil_div(it.kv_end - it.kv_begin, block_n)); };
  for (const FwdItem& tile : tiles) {
    const int64_t nb = blocks_of(tile);
    if (nb <= chunk) {
      plan.items.push_back(tile);
      continue;
    }
    const int64_t splits = ceil_div(nb, chunk);
    const int64_t per_split = ceil_div(nb, splits);
    CombineItem c{};
    c.q_row = tile.q_row;
    c.q_rows = tile.q_rows;
    c.first_slot = plan.num_slots;
    int32_t n = 0;
    for (int64_t b = 0; b < nb; b += per_split) {
      FwdItem part = tile;
      part.kv_begin = static_cast<int32_t>(tile.kv_begin + b * block_n);
      part.kv_end = static_cast<int32_t>(std::min<int64_t>(tile.kv_end, tile.kv_begin + (b + per_split) * block_n));
      part.partial_slot = plan.num_slots++;
      plan.items.push_back(part);
      ++n;
    }
    c.num_slots = n;
    plan.combines.push_back(c);
  }
  // Heaviest items first: the tail of the grid is then made of short items.
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [&](const FwdItem& a, const FwdItem& b) { return blocks_of(a) > blocks_of(b); });

  size_t at = 0;
  plan.items_offset = at;
  at = align_up(at + plan.items.size() * sizeof(FwdItem));
  plan.combines_offset = at;
  at = align_up(at + plan.combines.size() * sizeof(CombineItem));
  plan.uncovered_offset = at;
  at = align_up(at + plan.uncovered.size() * sizeof(RowRange));
  const size_t partial_rows = static_cast<size_t>(plan.num_slots) * static_cast<size_t>(heads) * block_m;
  plan.partial_o_offset = at;
  at = align_up(at + partial_rows * static_cast<size_t>(pr.head_dim) * sizeof(float));
  plan.partial_lse_offset = at;
  at = align_up(at + partial_rows * sizeof(float));
  plan.unit_counter_offset = at;
  at = align_up(at + sizeof(int32_t));
  plan.workspace_bytes = at;
  return plan;
}

BackwardPlan make_backward_plan(const AttentionProblem& problem, const Segment* segments, int64_t num_segments) {
  BackwardPlan plan;
  // The Hopper backward masks windows too (sm90/bwd_kernel.cuh, WINDOW): its key tiles (128 keys) take the
  // queries [q_begin, q_end) below, as the portable kernel's do.
  plan.problem = kernel_problem(problem, segments, num_segments);
  const AttentionProblem& pr = plan.problem;
  const int64_t left = pr.window_left, right = pr.window_right;
  std::vector<RowRange> kv_ranges;
  for (int64_t i = 0; i < num_segments; ++i) {
    const Segment& s = segments[i];
    if (s.kv_len <= 0) continue;
    kv_ranges.push_back({s.kv_offset, s.kv_offset + s.kv_len});
    const int64_t offset = pr.causal || pr.windowed() ? s.kv_len - s.q_len : 0;
    const int64_t block_n = bwd_block_n(pr);
    for (int64_t k0 = 0; k0 < s.kv_len; k0 += block_n) {
      BwdItem item{};
      item.q_row = s.q_offset;
      item.kv_row = s.kv_offset;
      item.q_len = static_cast<int32_t>(s.q_len);
      item.causal_offset = static_cast<int32_t>(offset);
      item.kv_begin = static_cast<int32_t>(k0);
      item.kv_rows = static_cast<int32_t>(std::min<int64_t>(block_n, s.kv_len - k0));
      // Query i sees key k0 iff i >= k0 - offset (causal); earlier queries never touch this tile.
      int64_t first = pr.causal ? std::clamp<int64_t>(k0 - offset, 0, s.q_len) : 0;
      // Window: query i sees key j iff i + offset - left <= j <= i + offset + right, so the tile's keys
      // [k0, k0 + kv_rows) are seen by queries [k0 - offset - right, k0 + kv_rows - 1 - offset + left].
      if (right >= 0) first = std::max(first, std::clamp<int64_t>(k0 - offset - right, 0, s.q_len));
      int64_t end = s.q_len;
      if (left >= 0) end = std::clamp<int64_t>(k0 + item.kv_rows - 1 - offset + left + 1, 0, s.q_len);
      item.q_begin = static_cast<int32_t>(first);
      item.q_end = static_cast<int32_t>(std::max(first, end));
      plan.items.push_back(item);
    }
  }
  std::stable_sort(plan.items.begin(), plan.items.end(), [](const BwdItem& a, const BwdItem& b) {
    return a.q_end - a.q_begin > b.q_end - b.q_begin;
  });

  // Exclusive KV: no key row is read by two segments (then each tile has one writer).
  std::vector<RowRange> sorted = kv_ranges;
  std::sort(sorted.begin(), sorted.end(), [](const RowRange& a, const RowRange& b) { return a.begin < b.begin; });
  plan.kv_exclusive = true;
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].begin < sorted[i - 1].end) plan.kv_exclusive = false;
  }
  if (plan.kv_exclusive) plan.unread_kv = gaps(kv_ranges, problem.tk);

  const size_t d = static_cast<size_t>(problem.head_dim);
  size_t at = 0;
  plan.items_offset = at;
  at = align_up(at + plan.items.size() * sizeof(BwdItem));
  // Delta and LSE (base 2), [hq, tq] each. The sm_90a backward loads each step's values from the 16-byte
  // boundary before its first row, BM + 4 floats: the padding keeps the last step's load inside the region
  // (its tensor map ends at the next multiple of 4 values; TMA fills what lies past that with zeros).
  const size_t stat_bytes = static_cast<size_t>(problem.tq) * problem.hq * sizeof(float) + kStatPadBytes;
  plan.delta_offset = at;
  at = align_up(at + stat_bytes);
  plan.lse_log2_offset = at;
  at = align_up(at + stat_bytes);
  plan.dq_acc_offset = at;
  at = align_up(at + static_cast<size_t>(problem.tq) * problem.hq * d * sizeof(float));
  if (!plan.kv_exclusive) {
    const size_t kv_bytes = static_cast<size_t>(problem.tk) * problem.hkv * d * sizeof(float);
    plan.dk_acc_offset = at;
    at = align_up(at + kv_bytes);
    plan.dv_acc_offset = at;
    at = align_up(at + kv_bytes);
  }
  plan.workspace_bytes = at;
  return plan;
}

}  // namespace cad::kernels
