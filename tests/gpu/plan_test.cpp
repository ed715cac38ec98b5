// plan_test.cpp -- the host-side work lists of the CUDA kernels (kernels/attention_plan.cpp), checked on
// the CPU: every query row of every segment is computed exactly once with exactly the keys it may see,
// KV splits partition the range, backward tiles cover every read key once per segment, shared KV is
// detected, and the workspace regions do not overlap. Needs no GPU (runs in CI where CUDA is enabled).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cad_kernels.h"

namespace cad::kernels {
namespace {

std::vector<Segment> random_segments(std::mt19937_64& rng, bool causal, int64_t* tq, int64_t* tk, bool share) {
  std::vector<Segment> segs;
  *tq = *tk = 0;
  std::uniform_int_distribution<int64_t> len(1, 3000), gap(0, 40);
  for (int i = 0; i < 20; ++i) {
    *tq += gap(rng);
    const int64_t q = len(rng);
    int64_t kv = causal ? q + len(rng) : len(rng);
    int64_t kv_offset = *tk + gap(rng);
    if (share && i % 3 == 1) {  // a second task of the previous document: a prefix of its KV
      kv_offset = segs.back().kv_offset;
      kv = std::max(q, segs.back().kv_len / 2);
    } else {
      *tk = kv_offset + kv;
    }
    segs.push_back({*tq, q, kv_offset, kv});
    *tq += q;
  }
  *tq += 7;
  *tk += 5;
  return segs;
}

class PlanTest : public ::testing::TestWithParam<std::tuple<bool, bool, int, bool>> {};

void check_forward_plan(bool causal, bool hopper, int num_sms, bool share, int head_dim) {
  std::mt19937_64 rng(causal * 7 + hopper * 3 + num_sms + share + head_dim);
  AttentionProblem pr;
  pr.hq = 8;
  pr.hkv = 2;
  pr.head_dim = head_dim;
  pr.causal = causal;
  pr.hopper = hopper;
  const std::vector<Segment> segs = random_segments(rng, causal, &pr.tq, &pr.tk, share);
  const ForwardPlan plan = make_forward_plan(pr, segs.data(), int64_t(segs.size()), num_sms);
  EXPECT_EQ(plan.block_m, hopper ? (head_dim == 64 ? 64 * CAD_FWD64_CONSUMERS : 128) : kFwdBlockM);

  // Keys seen per query row: [kv_begin, kv_end) pieces collected from every item.
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> seen;
  std::vector<int> slot_used(static_cast<size_t>(plan.num_slots), 0);
  for (const FwdItem& it : plan.items) {
    ASSERT_GT(it.q_rows, 0);
    ASSERT_LE(it.q_rows, plan.block_m);
    if (it.partial_slot >= 0) slot_used.at(static_cast<size_t>(it.partial_slot))++;
    for (int r = 0; r < it.q_rows; ++r) seen[it.q_row + r].push_back({it.kv_begin, it.kv_end});
  }
  for (int used : slot_used) EXPECT_EQ(used, 1);
  int64_t covered = 0;
  for (const Segment& s : segs) {
    for (int64_t i = 0; i < s.q_len; ++i) {
      auto ranges = seen[s.q_offset + i];
      std::sort(ranges.begin(), ranges.end());
      // The ranges must tile [0, end) without overlap, end >= the last key this query may see.
      int64_t at = 0;
      for (auto [b, e] : ranges) {
        ASSERT_EQ(b, at) << "query " << i << " of segment at " << s.q_offset;
        at = e;
      }
      const int64_t must_see = causal ? i + s.kv_len - s.q_len + 1 : s.kv_len;
      EXPECT_GE(at, must_see);
      EXPECT_LE(at, s.kv_len);
      ++covered;
    }
  }
  int64_t uncovered = 0;
  for (const RowRange& r : plan.uncovered) uncovered += r.end - r.begin;
  EXPECT_EQ(covered + uncovered, pr.tq);
  // Splits happen only when the GPU would otherwise be short of work, and every split tile is merged.
  int64_t split_items = 0;
  for (const FwdItem& it : plan.items) split_items += it.partial_slot >= 0;
  int64_t merged = 0;
  for (const CombineItem& c : plan.combines) merged += c.num_slots;
  EXPECT_EQ(split_items, merged);
  // Workspace regions in order, aligned, inside the buffer.
  const std::vector<size_t> offsets = {plan.items_offset, plan.combines_offset, plan.uncovered_offset,
                                       plan.partial_o_offset, plan.partial_lse_offset, plan.workspace_bytes};
  EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
  for (size_t o : offsets) EXPECT_EQ(o % 256, 0u);
  EXPECT_GE(plan.combines_offset - plan.items_offset, plan.items.size() * sizeof(FwdItem));
}

TEST_P(PlanTest, ForwardCoversEveryQueryOnceWithItsKeys) {
  const auto [causal, hopper, num_sms, share] = GetParam();
  // Both head dims: the Hopper kernel's query tile depends on it (128 at D 128, 192 at D 64).
  for (const int head_dim : {128, 64}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    check_forward_plan(causal, hopper, num_sms, share, head_dim);
  }
}

TEST_P(PlanTest, BackwardTilesEveryReadKeyOncePerSegment) {
  const auto [causal, hopper, num_sms, share] = GetParam();
  (void)num_sms;
  std::mt19937_64 rng(causal * 5 + hopper + share * 11);
  AttentionProblem pr;
  pr.hq = 4;
  pr.hkv = 4;
  pr.head_dim = hopper ? 128 : 64;
  pr.causal = causal;
  pr.hopper = hopper;
  const std::vector<Segment> segs = random_segments(rng, causal, &pr.tq, &pr.tk, share);
  const BackwardPlan plan = make_backward_plan(pr, segs.data(), int64_t(segs.size()));
  EXPECT_EQ(plan.kv_exclusive, !share);
  std::map<std::pair<int64_t, int64_t>, int64_t> keys;  // (kv_row of segment, q_row) -> keys covered
  for (const BwdItem& it : plan.items) {
    ASSERT_GT(it.kv_rows, 0);
    ASSERT_LE(it.kv_rows, bwd_block_n(pr));
    ASSERT_GE(it.q_begin, 0);
    ASSERT_LE(it.q_begin, it.q_len);
    if (causal) {  // the query before q_begin sees none of the tile's keys; q_begin sees its first key
      if (it.q_begin > 0) {
        EXPECT_LT(it.q_begin - 1 + it.causal_offset, it.kv_begin);
      }
      if (it.q_begin < it.q_len) {
        EXPECT_LE(it.kv_begin, it.q_begin + it.causal_offset);
      }
    } else {
      EXPECT_EQ(it.q_begin, 0);
    }
    keys[{it.kv_row, it.q_row}] += it.kv_rows;
  }
  for (const Segment& s : segs) EXPECT_EQ((keys[{s.kv_offset, s.q_offset}]), s.kv_len);
  if (plan.kv_exclusive) {
    int64_t unread = 0, read = 0;
    for (const RowRange& r : plan.unread_kv) unread += r.end - r.begin;
    for (const Segment& s : segs) read += s.kv_len;
    EXPECT_EQ(unread + read, pr.tk);
  }
  // Workspace regions in order, 256-byte aligned (the sm_90a backward bulk-copies Delta and LSE, which
  // needs 16-byte aligned sources), each [hq, tq] statistic a region of its own with room after its last
  // value for one step's aligned copy (64 + 4 floats) to stay inside it.
  const size_t stat_bytes = static_cast<size_t>(pr.tq) * pr.hq * sizeof(float);
  const std::vector<size_t> offsets = {plan.items_offset, plan.delta_offset, plan.lse_log2_offset, plan.dq_acc_offset,
                                       plan.workspace_bytes};
  EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
  for (size_t o : offsets) EXPECT_EQ(o % 256, 0u);
  EXPECT_GE(plan.lse_log2_offset - plan.delta_offset, stat_bytes + 68 * sizeof(float));
  EXPECT_GE(plan.dq_acc_offset - plan.lse_log2_offset, stat_bytes + 68 * sizeof(float));
}

INSTANTIATE_TEST_SUITE_P(CudaPlan, PlanTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(1, 132),
                                            ::testing::Bool()));

// The KV split is a scheduling decision: a dense causal batch has plenty of evenly sized work and is
// left whole; a few short query shards against long KV are split, on the kernel's key tiles.
TEST(CudaPlanSplit, DenseBatchStaysWholeAndShortShardsSplitOnKeyTiles) {
  for (const bool hopper : {true, false}) {
    AttentionProblem pr;
    pr.hq = 32;
    pr.hkv = 8;
    pr.head_dim = 128;
    pr.causal = true;
    pr.hopper = hopper;
    for (const int64_t n : {4096, 16384, 65536}) {  // 64K: too many candidate pieces to simulate
      pr.tq = pr.tk = n;
      const Segment dense{0, n, 0, n};
      const ForwardPlan whole = make_forward_plan(pr, &dense, 1, 132);
      EXPECT_TRUE(whole.combines.empty()) << "hopper=" << hopper << " n=" << n;
      ASSERT_EQ(whole.items.size(), static_cast<size_t>(n / whole.block_m));
      EXPECT_EQ(whole.items.front().kv_end, n) << "heaviest first";
    }

    std::vector<Segment> shards;
    pr.tq = pr.tk = 0;
    for (int i = 0; i < 2; ++i) {  // 2 shards x 32 heads: fewer work units than SMs unless split
      shards.push_back({pr.tq, 128, pr.tk, 131072});
      pr.tq += 128;
      pr.tk += 131072;
    }
    const ForwardPlan split = make_forward_plan(pr, shards.data(), static_cast<int64_t>(shards.size()), 132);
    EXPECT_FALSE(split.combines.empty()) << "hopper=" << hopper;
    const int block_n = fwd_block_n(pr);
    for (const FwdItem& it : split.items) {
      EXPECT_EQ(it.kv_begin % block_n, 0) << "hopper=" << hopper;
      if (it.partial_slot >= 0) {
        EXPECT_GE(it.kv_end - it.kv_begin, 512) << "hopper=" << hopper;
      }
    }
  }
}

// The backward's key tiles are the kernel's: 128 keys for the Hopper kernel at both head dims (two
// warpgroups of 64), 16 per warp for the portable one (64 at D=64, 128 at D=128).
TEST(CudaPlanBackwardTiles, KeyTilesFollowTheKernel) {
  for (const bool hopper : {true, false}) {
    for (const int d : {64, 128}) {
      AttentionProblem pr;
      pr.hq = 4;
      pr.hkv = 2;
      pr.head_dim = d;
      pr.causal = true;
      pr.hopper = hopper;
      pr.tq = pr.tk = 1000;
      const Segment seg{0, 1000, 0, 1000};
      const BackwardPlan plan = make_backward_plan(pr, &seg, 1);
      const int64_t tile = hopper ? 128 : (d == 128 ? 128 : 64);
      ASSERT_EQ(static_cast<int64_t>(plan.items.size()), (1000 + tile - 1) / tile) << "hopper=" << hopper << " d=" << d;
      for (const BwdItem& it : plan.items) {
        EXPECT_EQ(it.kv_begin % tile, 0);
        EXPECT_EQ(it.kv_rows, std::min<int64_t>(tile, 1000 - it.kv_begin));
      }
    }
  }
}

// Sliding windows (ABI v1.2): query i at key position p = i + kv_len - q_len sees keys [p - left, p + right]
// (and none after p when causal), clipped to the segment. The plans give every query tile only the key range
// its queries' windows reach (skipping the rest: no item, no masked tile), and every backward key tile the
// exact queries [q_begin, q_end) that see one of its keys. Both run on the kernels asked for (the Hopper
// kernels mask windows: 128-query forward tiles, 128-key backward tiles).
struct Visible {
  int64_t begin, end;
};
Visible visible(const Segment& s, int64_t i, bool causal, int64_t left, int64_t right) {
  const int64_t p = i + s.kv_len - s.q_len;
  int64_t begin = 0, end = s.kv_len;
  if (causal) end = std::min(end, p + 1);
  if (left >= 0) begin = std::max(begin, p - left);
  if (right >= 0) end = std::min(end, p + right + 1);
  return {begin, std::max(begin, end)};
}

TEST(CudaPlanWindow, TilesReadOnlyTheKeysTheirWindowsReachOnTheKernelsAskedFor) {
  struct Case {
    bool causal;
    int64_t left, right;
  };
  for (const Case c : {Case{true, 0, -1}, Case{true, 100, -1}, Case{true, 1000, -1}, Case{false, 37, 5},
                       Case{false, -1, 200}, Case{false, 300, -1}, Case{false, 0, 0}}) {
    for (const bool share : {false, true}) {
      for (const int num_sms : {1, 132}) {
       for (const bool hopper : {false, true}) {
        std::mt19937_64 rng(c.left * 3 + c.right + share + num_sms);
        AttentionProblem pr;
        pr.hq = 8;
        pr.hkv = 2;
        pr.head_dim = 128;
        pr.causal = c.causal;
        pr.window_left = static_cast<int32_t>(c.left);
        pr.window_right = static_cast<int32_t>(c.right);
        pr.hopper = hopper;  // asked for: the plans keep it
        const std::vector<Segment> segs = random_segments(rng, c.causal, &pr.tq, &pr.tk, share);
        const std::string what = "causal=" + std::to_string(c.causal) + " window=(" + std::to_string(c.left) + ", " +
                                 std::to_string(c.right) + ") share=" + std::to_string(share) +
                                 " sms=" + std::to_string(num_sms) + " hopper=" + std::to_string(hopper);
        const ForwardPlan plan = make_forward_plan(pr, segs.data(), int64_t(segs.size()), num_sms);
        ASSERT_TRUE(plan.problem.windowed()) << what;  // every case hides keys of these segments
        EXPECT_EQ(plan.problem.hopper, hopper) << what;
        EXPECT_EQ(plan.block_m, hopper ? fwd_block_m90(pr.head_dim) : kFwdBlockM) << what;
        for (const FwdItem& it : plan.items) EXPECT_LE(it.q_rows, plan.block_m) << what;
        std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> seen;
        std::map<int64_t, const Segment*> segment_of;
        for (const Segment& s : segs) {
          for (int64_t i = 0; i < s.q_len; ++i) segment_of[s.q_offset + i] = &s;
        }
        for (const FwdItem& it : plan.items) {
          const Segment& s = *segment_of.at(it.q_row);
          ASSERT_EQ(it.causal_offset, s.kv_len - s.q_len) << what;
          // No item reads a key that none of its queries sees (the first key, and the last, is seen by one).
          if (it.kv_end > it.kv_begin && it.partial_slot < 0) {
            EXPECT_EQ(it.kv_begin, std::clamp<int64_t>(visible(s, it.q_index, c.causal, c.left, c.right).begin,
                                                       0, s.kv_len)) << what;
            bool first_seen = false, last_seen = false;
            for (int r = 0; r < it.q_rows; ++r) {
              const Visible v = visible(s, it.q_index + r, c.causal, c.left, c.right);
              first_seen |= v.begin <= it.kv_begin && it.kv_begin < v.end;
              last_seen |= v.begin <= it.kv_end - 1 && it.kv_end - 1 < v.end;
            }
            EXPECT_TRUE(first_seen && last_seen) << what << " item at row " << it.q_row;
          }
          for (int r = 0; r < it.q_rows; ++r) seen[it.q_row + r].push_back({it.kv_begin, it.kv_end});
        }
        for (const Segment& s : segs) {
          for (int64_t i = 0; i < s.q_len; ++i) {
            auto ranges = seen[s.q_offset + i];
            ASSERT_FALSE(ranges.empty()) << what;
            std::sort(ranges.begin(), ranges.end());
            int64_t at = ranges.front().first;
            for (auto [b, e] : ranges) {  // contiguous, no overlap
              ASSERT_EQ(b, at) << what << " query " << i << " of segment at " << s.q_offset;
              at = e;
            }
            const Visible v = visible(s, i, c.causal, c.left, c.right);
            if (v.end > v.begin) {  // the query's window is inside what its items read
              EXPECT_LE(ranges.front().first, v.begin) << what << " query " << i;
              EXPECT_GE(at, v.end) << what << " query " << i;
            }
          }
        }

        const BackwardPlan bwd = make_backward_plan(pr, segs.data(), int64_t(segs.size()));
        EXPECT_EQ(bwd.problem.hopper, hopper) << what;
        std::map<std::pair<int64_t, int64_t>, int64_t> keys;
        for (const BwdItem& it : bwd.items) {
          ASSERT_LE(it.kv_rows, bwd_block_n(bwd.problem)) << what;
          ASSERT_EQ(it.kv_begin % bwd_block_n(bwd.problem), 0) << what;
          ASSERT_LE(0, it.q_begin);
          ASSERT_LE(it.q_begin, it.q_end);
          ASSERT_LE(it.q_end, it.q_len);
          keys[{it.kv_row, it.q_row}] += it.kv_rows;
          const Segment* seg = nullptr;
          for (const Segment& s : segs) {
            if (s.q_offset == it.q_row && s.kv_offset == it.kv_row) seg = &s;
          }
          ASSERT_NE(seg, nullptr);
          // Exactly the queries [q_begin, q_end) see a key of the tile.
          for (int64_t i = 0; i < it.q_len; ++i) {
            const Visible v = visible(*seg, i, c.causal, c.left, c.right);
            const bool sees = v.begin < std::min<int64_t>(v.end, it.kv_begin + it.kv_rows) &&
                              std::max<int64_t>(v.begin, it.kv_begin) < v.end;
            EXPECT_EQ(sees, i >= it.q_begin && i < it.q_end) << what << " tile at key " << it.kv_begin
                                                                << " query " << i;
          }
        }
        for (const Segment& s : segs) EXPECT_EQ((keys[{s.kv_offset, s.q_offset}]), s.kv_len) << what;
       }
      }
    }
  }
}

// window_hides_keys against its definition: some query sees, without the window, a key that the window hides.
// Small random segments (empty ones too) and every window near their lengths.
TEST(CudaPlanWindow, HidesKeysIffSomeQueryLosesAKey) {
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> len(0, 9);
  for (int trial = 0; trial < 300; ++trial) {
    const bool causal = trial % 2 == 0;
    std::vector<Segment> segs;
    for (int i = 0, n = 1 + trial % 3; i < n; ++i) {
      const int64_t q = len(rng), kv = causal ? q + len(rng) : len(rng);
      segs.push_back({0, q, 0, kv});
    }
    for (int64_t left = -1; left <= 12; ++left) {
      for (int64_t right = -1; right <= (causal ? -1 : 12); ++right) {
        AttentionProblem pr;
        pr.causal = causal;
        pr.window_left = static_cast<int32_t>(left);
        pr.window_right = static_cast<int32_t>(right);
        bool hides = false;
        for (const Segment& s : segs) {
          for (int64_t i = 0; i < s.q_len; ++i) {
            const Visible all = visible(s, i, causal, -1, -1), win = visible(s, i, causal, left, right);
            hides |= win.end - win.begin < all.end - all.begin;
          }
        }
        EXPECT_EQ(window_hides_keys(pr, segs.data(), int64_t(segs.size())), hides)
            << "trial " << trial << " causal=" << causal << " window=(" << left << ", " << right << ")";
      }
    }
  }
}

// A window that hides no key (causal: left + 1 >= every kv_len; non-causal: also right + 1 >= every q_len)
// is dropped by the plans: forward and backward are then exactly the unwindowed plans, on the Hopper kernels
// where asked for. One short of that, the window stays, on the same kernels (the Hopper ones mask windows).
TEST(CudaPlanWindow, WindowThatHidesNoKeyRunsAsTheUnwindowedProblem) {
  for (const bool causal : {true, false}) {
    for (const bool share : {false, true}) {
      std::mt19937_64 rng(causal * 2 + share + 40);
      AttentionProblem plain;
      plain.hq = 8;
      plain.hkv = 2;
      plain.head_dim = 128;
      plain.causal = causal;
      plain.hopper = true;
      std::vector<Segment> segs = random_segments(rng, causal, &plain.tq, &plain.tk, share);
      segs.push_back({plain.tq, 0, plain.tk, 0});  // empty segments hide nothing
      segs.push_back({plain.tq, 0, 0, 5});
      int64_t max_q = 0, max_kv = 0;
      for (const Segment& s : segs) {
        max_q = std::max(max_q, s.q_len);
        max_kv = std::max(max_kv, s.kv_len);
      }
      const ForwardPlan want_fwd = make_forward_plan(plain, segs.data(), int64_t(segs.size()), 132);
      const BackwardPlan want_bwd = make_backward_plan(plain, segs.data(), int64_t(segs.size()));
      ASSERT_TRUE(want_fwd.problem.hopper);
      struct Case {
        int64_t left, right;
        bool hides;
      };
      std::vector<Case> cases = {{max_kv - 1, -1, false}, {max_kv + 1000000, -1, false}, {max_kv - 2, -1, true}};
      if (!causal) {
        cases.push_back({-1, max_q - 1, false});
        cases.push_back({max_kv - 1, max_q - 1, false});
        cases.push_back({max_kv - 1, max_q - 2, true});
        cases.push_back({-1, max_q - 2, true});
      }
      for (const Case& c : cases) {
        const std::string what = "causal=" + std::to_string(causal) + " share=" + std::to_string(share) +
                                 " window=(" + std::to_string(c.left) + ", " + std::to_string(c.right) + ")";
        AttentionProblem pr = plain;
        pr.window_left = static_cast<int32_t>(c.left);
        pr.window_right = static_cast<int32_t>(c.right);
        EXPECT_EQ(window_hides_keys(pr, segs.data(), int64_t(segs.size())), c.hides) << what;
        const ForwardPlan fwd = make_forward_plan(pr, segs.data(), int64_t(segs.size()), 132);
        const BackwardPlan bwd = make_backward_plan(pr, segs.data(), int64_t(segs.size()));
        EXPECT_TRUE(fwd.problem.hopper) << what;
        EXPECT_TRUE(bwd.problem.hopper) << what;
        EXPECT_EQ(fwd.problem.windowed(), c.hides) << what;
        EXPECT_EQ(bwd.problem.windowed(), c.hides) << what;
        if (c.hides) {
          EXPECT_EQ(fwd.problem.window_left, pr.window_left) << what;
          EXPECT_EQ(fwd.problem.window_right, pr.window_right) << what;
          continue;
        }
        EXPECT_EQ(fwd.block_m, want_fwd.block_m) << what;
        ASSERT_EQ(fwd.items.size(), want_fwd.items.size()) << what;
        EXPECT_EQ(std::memcmp(fwd.items.data(), want_fwd.items.data(), fwd.items.size() * sizeof(FwdItem)), 0) << what;
        EXPECT_EQ(fwd.combines.size(), want_fwd.combines.size()) << what;
        EXPECT_EQ(fwd.workspace_bytes, want_fwd.workspace_bytes) << what;
        ASSERT_EQ(bwd.items.size(), want_bwd.items.size()) << what;
        EXPECT_EQ(std::memcmp(bwd.items.data(), want_bwd.items.data(), bwd.items.size() * sizeof(BwdItem)), 0) << what;
        EXPECT_EQ(bwd.workspace_bytes, want_bwd.workspace_bytes) << what;
      }
    }
  }
}

TEST(CudaPlanEmpty, EmptyBatchLeavesEveryRowUncovered) {
  AttentionProblem pr;
  pr.tq = 100;
  pr.tk = 50;
  pr.hq = pr.hkv = 2;
  pr.head_dim = 64;
  const ForwardPlan f = make_forward_plan(pr, nullptr, 0, 132);
  EXPECT_TRUE(f.items.empty());
  ASSERT_EQ(f.uncovered.size(), 1u);
  EXPECT_EQ(f.uncovered[0].begin, 0);
  EXPECT_EQ(f.uncovered[0].end, 100);
  const BackwardPlan b = make_backward_plan(pr, nullptr, 0);
  EXPECT_TRUE(b.items.empty());
  ASSERT_EQ(b.unread_kv.size(), 1u);
  EXPECT_EQ(b.unread_kv[0].end, 50);
}

}  // namespace
}  // namespace cad::kernels
