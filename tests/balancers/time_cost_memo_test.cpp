// time_cost_memo_test.cpp -- the fast path of prefix_aware's time mode changes no plan: the rate-table
// lookup split in two steps (RateTable::locate_q / locate_kv / relative_time_at) against a plain
// reference written here from rate_table.h's definition, the per-plan memo (TimeCostMemo) against
// time_weighted_cost under heavy slot collisions, and whole time-balanced plans with the memo against
// plans whose every cost is computed afresh (config "cost_memo": false), on Pretrain-recipe batches
// (skipped when the data file is absent), under a memory cap, and on synthetic layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "balancer_harness.h"
#include "batch_recipe.h"
#include "doc_lengths.h"
#include "plan_time.h"
#include "plugin_paths.h"
#include "random_layout.h"

namespace {

using namespace cad::balancer_test;
using cad::plan::RateTable;

const std::string kH200 = std::string(CAD_SOURCE_DIR) + "/configs/calibration/h200.json";
// A table with "backward_tiles" (the backward priced by tile pairs, rate_table.h).
const std::string kPairs = std::string(CAD_SOURCE_DIR) + "/bench/results/rate_table_h200/rate_table_h200_units_pairs.json";

// rate_table.h's lookup, written out plainly: bilinear interpolation of each rate in (log q, log kv)
// between the grid lines around the point, q and kv clamped to the grid's edges; the relative time
// is forward + backward time per FLOP over the same for the dense entry.
double reference_relative_time(const RateTable& t, int64_t q, int64_t kv) {
  auto place = [](const std::vector<int64_t>& axis, int64_t x, size_t& lo, size_t& hi, double& w) {
    const int64_t c = std::clamp(x, axis.front(), axis.back());
    lo = 0;
    while (lo + 1 < axis.size() && axis[lo + 1] <= c) ++lo;
    hi = std::min(lo + 1, axis.size() - 1);
    w = hi == lo ? 0.0
                 : (std::log(static_cast<double>(c)) - std::log(static_cast<double>(axis[lo]))) /
                       (std::log(static_cast<double>(axis[hi])) - std::log(static_cast<double>(axis[lo])));
  };
  size_t q0, q1, k0, k1;
  double wq, wk;
  place(t.q_lens, q, q0, q1, wq);
  place(t.kv_lens, kv, k0, k1, wk);
  const size_t nk = t.kv_lens.size();
  auto rate = [&](const std::vector<cad::plan::Rate>& r) {
    const double low = (1 - wk) * r[q0 * nk + k0].tflops + wk * r[q0 * nk + k1].tflops;
    const double high = (1 - wk) * r[q1 * nk + k0].tflops + wk * r[q1 * nk + k1].tflops;
    return (1 - wq) * low + wq * high;
  };
  const double dense = 1 / t.dense_fwd.tflops + t.backward_flop_ratio / t.dense_bwd.tflops;
  return (1 / rate(t.fwd) + t.backward_flop_ratio / rate(t.bwd)) / dense;
}

std::string rate(double tflops) { return R"({"tflops": )" + std::to_string(tflops) + R"(, "source": "test"})"; }

// A table with one q line (every q clamps to it) and uneven kv lines.
std::string one_q_line_json() {
  std::string grid;
  const std::vector<int> kvs = {100, 3000, 70000};
  for (size_t i = 0; i < kvs.size(); ++i) {
    grid += std::string(i ? ", " : "") + R"({"q": 512, "kv": )" + std::to_string(kvs[i]) + R"(, "fwd": )" +
            rate(300 + 100.0 * static_cast<double>(i)) + R"(, "bwd": )" + rate(150 + 90.0 * static_cast<double>(i)) +
            "}";
  }
  return R"({"gpu": "test", "head_dim": 128, "backward_flop_ratio": 2.5,
    "dense": {"len": 8192, "fwd": )" + rate(600) + R"(, "bwd": )" + rate(400) + R"(},
    "q_lens": [512], "kv_lens": [100, 3000, 70000], "grid": [)" + grid + "]}";
}

RateTable one_q_line_table() { return cad::plan::parse_rate_table(one_q_line_json(), "one_q_line.json"); }

// Lengths worth checking on an axis: every grid line and one either side, 1 and 2, and far past the
// last line (clamped).
std::vector<int64_t> edge_values(const std::vector<int64_t>& axis) {
  std::vector<int64_t> v = {1, 2, axis.back() * 3, axis.back() * 1000};
  for (int64_t x : axis) v.insert(v.end(), {x - 1, x, x + 1});
  v.erase(std::remove_if(v.begin(), v.end(), [](int64_t x) { return x < 1; }), v.end());
  return v;
}

void expect_lookup_matches_reference(const RateTable& t) {
  std::vector<int64_t> qs = edge_values(t.q_lens), kvs = edge_values(t.kv_lens);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 400; ++i) {  // random shapes across (and beyond) the grid, log-uniform
    qs.push_back(static_cast<int64_t>(std::exp(std::uniform_real_distribution<double>(0, 14)(rng))));
    kvs.push_back(static_cast<int64_t>(std::exp(std::uniform_real_distribution<double>(0, 14)(rng))));
  }
  int checked = 0;
  for (int64_t q : qs) {
    for (int64_t kv : kvs) {
      const double fast = t.relative_time_at(t.locate_q(q), t.locate_kv(kv));
      const double ref = reference_relative_time(t, q, kv);
      ASSERT_NEAR(fast, ref, 1e-12 * ref) << t.path << " q " << q << " kv " << kv;
      ASSERT_EQ(fast, t.relative_time(q, kv)) << "q " << q << " kv " << kv;  // the one-step lookup, bit for bit
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(TimeCostFast, SplitLookupMatchesAPlainReferenceOnTheGridEdgesAndClamped) {
  const RateTable h200 = cad::plan::load_rate_table(kH200);
  expect_lookup_matches_reference(h200);
  expect_lookup_matches_reference(one_q_line_table());
  // The reference is not vacuous: it tells interpolated shapes from the grid lines around them.
  EXPECT_GT(std::abs(reference_relative_time(h200, 128, 2000) - reference_relative_time(h200, 128, 1024)), 1e-3);
}

// Costs of random ranges, over ten times as many as the memo's slots, asked in random order with repeats: every answer is time_weighted_cost's (a stale or colliding slot would show) and within
// rounding of the plain reference (the grid-only table; with "backward_tiles" the memo's key must still
// determine the cost: the pairs depend on q, kv and causal only).
TEST(TimeCostFast, MemoReturnsTheDirectCostUnderCollisions) {
  for (const auto& [path, causal] : {std::pair{kH200, true}, std::pair{kH200, false}, std::pair{kPairs, true},
                                     std::pair{kPairs, false}}) {
  const RateTable t = cad::plan::load_rate_table(path);
  ASSERT_EQ(t.has_backward_tiles, path == kPairs);
  {
    SCOPED_TRACE(path + (causal ? " causal" : " non-causal"));
    cad::plan::TimeCostMemo memo(t, causal);
    std::mt19937_64 rng(causal ? 17 : 18);
    struct Key {
      int64_t b, e, len;
    };
    // As the greedy asks: many starts for one end (a search over starts), many ends for one start (a
    // search over ends), one range in several documents; 64000 keys in all, ~16 per slot, so keys
    // differing in one field share slots.
    std::vector<Key> keys;
    for (int i = 0; i < 1000; ++i) {
      const int64_t e = 1 + static_cast<int64_t>(rng() % 300000);
      for (int j = 0; j < 8; ++j) {
        const int64_t b = static_cast<int64_t>(rng() % static_cast<uint64_t>(e));
        for (int k = 0; k < 5; ++k) keys.push_back({b, e, e + static_cast<int64_t>(rng() % 100000)});
        for (int k = 0; k < 3; ++k) keys.push_back({b, b + 1 + static_cast<int64_t>(rng() % (e - b)), e});  // one start, other ends
      }
    }
    keys.push_back({5, 5, 10});  // empty ranges cost 0
    keys.push_back({7, 3, 10});
    int64_t nonzero = 0;
    for (int i = 0; i < 400000; ++i) {
      const Key& k = keys[static_cast<size_t>(rng() % keys.size())];
      const int64_t got = memo.cost(k.b, k.e, k.len);
      ASSERT_EQ(got, cad::plan::time_weighted_cost(k.b, k.e, k.len, causal, t))
          << "[" << k.b << ", " << k.e << ") of " << k.len;
      nonzero += got > 0;
      if (t.has_backward_tiles) continue;
      const int64_t entries = cad::plan::task_cost(k.b, k.e, k.len, causal);
      const double ref = static_cast<double>(entries) *
                         reference_relative_time(t, k.e - k.b, causal ? k.e : k.len);
      ASSERT_LE(std::abs(static_cast<double>(got) - ref), 0.5 + 1e-12 * ref) << "[" << k.b << ", " << k.e << ")";
    }
    EXPECT_GT(nonzero, 390000);
    EXPECT_EQ(memo.cost(5, 5, 10), 0);
  }
  }
}

// Time-balanced plans with the memo (the default) and with every cost computed afresh: identical
// task lists, and not trivially so (work moved).
void expect_same_plans(const std::string& table_path, const RankPieces& batch, int32_t servers,
                       const cad_cost_params_v1_t& cost) {
  // min_time_gain 0: always the time-balanced plan, the one the memo serves.
  const std::string config = R"({"min_time_gain": 0, "rate_table": ")" + table_path + R"(")";
  LoadedBalancer fast(plugin_path("prefix_aware"), config + "}");
  LoadedBalancer plain(plugin_path("prefix_aware"), config + R"(, "cost_memo": false})");
  ASSERT_EQ(fast.create_status(), CAD_STATUS_OK) << fast.create_error();
  ASSERT_EQ(plain.create_status(), CAD_STATUS_OK) << plain.create_error();
  const PlanResult a = fast.plan(batch, servers, cost);
  const PlanResult b = plain.plan(batch, servers, cost);
  ASSERT_EQ(a.status, CAD_STATUS_OK) << a.error;
  ASSERT_EQ(b.status, CAD_STATUS_OK) << b.error;
  size_t pieces = 0;
  for (const auto& r : batch) pieces += r.size();
  EXPECT_GT(a.tasks.size(), pieces) << "nothing moved: the comparison would be vacuous";
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  for (size_t i = 0; i < a.tasks.size(); ++i) {
    const cad_task_v1_t &x = a.tasks[i], &y = b.tasks[i];
    ASSERT_TRUE(x.doc_id == y.doc_id && x.q_begin == y.q_begin && x.q_end == y.q_end && x.server == y.server)
        << "task " << i << ": doc " << x.doc_id << " [" << x.q_begin << ", " << x.q_end << ") on " << x.server
        << " with the memo, doc " << y.doc_id << " [" << y.q_begin << ", " << y.q_end << ") on " << y.server
        << " without";
  }
}

TEST(TimeCostFast, PretrainPlansEqualThoseComputedWithoutTheMemo) {
  if (!std::filesystem::exists(CAD_PRETRAIN_LENGTHS)) GTEST_SKIP() << CAD_PRETRAIN_LENGTHS << " not found";
  const auto lengths = cad::workload::load_lengths(CAD_PRETRAIN_LENGTHS);
  struct Case {
    int32_t servers;
    int64_t context;
    uint64_t seed;
  };
  for (const Case& c : {Case{512, 131072, 1}, Case{64, 131072, 1}, Case{128, 65536, 2}, Case{16, 524288, 3},
                        Case{32, 32768, 4}}) {
    SCOPED_TRACE(std::to_string(c.servers) + " servers x " + std::to_string(c.context) + ", seed " +
                 std::to_string(c.seed));
    expect_same_plans(kH200, cad::workload::sample_batch(lengths, c.context, c.servers, c.seed), c.servers,
                      cost_params(128));
  }
  // Under a memory cap (the wide and fair passes cut shards to fit memory), and non-causal.
  const RankPieces batch = cad::workload::sample_batch(lengths, 131072, 32, 5);
  expect_same_plans(kH200, batch, 32, cost_params(128, int64_t{1} << 30));
  expect_same_plans(kH200, cad::workload::sample_batch(lengths, 65536, 16, 6), 16, cost_params(128, 0, false));
}

// 12 ranks (3 empty) holding 80 documents of up to 200K tokens.
RankPieces synthetic_layout(uint64_t seed) {
  LayoutOptions o;
  o.ranks = 12;
  o.docs = 80;
  o.max_doc_len = 200000;
  o.empty_ranks = 3;
  return random_layout(seed, o);
}

TEST(TimeCostFast, SyntheticPlansEqualThoseComputedWithoutTheMemo) {
  const std::string one_line = ::testing::TempDir() + "one_q_line_rates.json";
  std::ofstream(one_line) << one_q_line_json();
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const RankPieces layout = synthetic_layout(seed);
    expect_same_plans(kH200, layout, 12, cost_params(64));
    expect_same_plans(one_line, layout, 14, cost_params(32));  // two servers beyond the ranks
  }
}

// With "backward_tiles": time-balanced plans are the same with and without the memo, the same when
// planned again, and not the grid-only table's plans (the key changes what is balanced).
TEST(TimeCostFast, BackwardTilesPlansAreDeterministicAndEqualWithoutTheMemo) {
  for (uint64_t seed : {1u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const RankPieces layout = synthetic_layout(seed);
    expect_same_plans(kPairs, layout, 12, cost_params(64));
    expect_same_plans(kPairs, layout, 12, cost_params(64, 0, false));  // non-causal
    LoadedBalancer pairs(plugin_path("prefix_aware"), R"({"min_time_gain": 0, "rate_table": ")" + kPairs + R"("})");
    LoadedBalancer grid(plugin_path("prefix_aware"),
                        R"({"min_time_gain": 0, "rate_table": ")" + std::string(CAD_SOURCE_DIR) +
                            R"(/bench/results/rate_table_h200/rate_table_h200_units.json"})");
    const PlanResult a = pairs.plan(layout, 12, cost_params(64)), b = pairs.plan(layout, 12, cost_params(64));
    const PlanResult c = grid.plan(layout, 12, cost_params(64));
    ASSERT_EQ(a.status, CAD_STATUS_OK) << a.error;
    ASSERT_EQ(c.status, CAD_STATUS_OK) << c.error;
    const auto same = [](const PlanResult& x, const PlanResult& y) {
      return x.tasks.size() == y.tasks.size() &&
             std::equal(x.tasks.begin(), x.tasks.end(), y.tasks.begin(), [](const cad_task_v1_t& p, const cad_task_v1_t& q) {
               return p.doc_id == q.doc_id && p.q_begin == q.q_begin && p.q_end == q.q_end && p.server == q.server;
             });
    };
    EXPECT_TRUE(same(a, b)) << "planning the same batch twice gave different plans";
    EXPECT_FALSE(same(a, c)) << "the backward_tiles key changed no task: the test would not see it ignored";
  }
  if (!std::filesystem::exists(CAD_PRETRAIN_LENGTHS)) GTEST_SKIP() << CAD_PRETRAIN_LENGTHS << " not found";
  const auto lengths = cad::workload::load_lengths(CAD_PRETRAIN_LENGTHS);
  expect_same_plans(kPairs, cad::workload::sample_batch(lengths, 131072, 64, 1), 64, cost_params(128));
  expect_same_plans(kPairs, cad::workload::sample_batch(lengths, 65536, 8, 4), 8, cost_params(128));
}

}  // namespace
