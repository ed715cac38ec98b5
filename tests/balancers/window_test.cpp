// window_test.cpp -- sliding windows in the cost model and the balancers: the windowed cost of a task
// against a key-by-key count, the KV range a task needs (one copy per server and document: the hull),
// and every balancer planning windowed batches (valid plans; prefix_aware balanced by windowed cost).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>

#include "balancer_harness.h"
#include "plugin_paths.h"

namespace {

using namespace cad::balancer_test;

cad::plan::ModelParams mask(bool causal, int64_t left, int64_t right) {
  cad::plan::ModelParams p;
  p.causal = causal;
  p.window_left = left;
  p.window_right = causal ? -1 : right;
  return p;
}

// Entries counted key by key: query p of the document sees key j iff the mask allows it.
int64_t brute_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, const cad::plan::ModelParams& m) {
  int64_t n = 0;
  for (int64_t p = q_begin; p < q_end; ++p) {
    for (int64_t j = 0; j < doc_len; ++j) {
      if (m.causal && j > p) continue;
      if (m.window_left >= 0 && p - j > m.window_left) continue;  // distances: no overflow at the limits
      if (m.window_right >= 0 && j - p > m.window_right) continue;
      ++n;
    }
  }
  return n;
}

TEST(WindowCost, MatchesAKeyByKeyCount) {
  std::mt19937 rng(3);
  for (int i = 0; i < 3000; ++i) {
    const int64_t len = std::uniform_int_distribution<int64_t>(1, 60)(rng);
    const int64_t a = std::uniform_int_distribution<int64_t>(0, len)(rng);
    const int64_t b = std::uniform_int_distribution<int64_t>(a, len)(rng);
    const bool causal = i % 2 == 0;
    const int64_t left = std::uniform_int_distribution<int64_t>(-1, 70)(rng);
    const int64_t right = std::uniform_int_distribution<int64_t>(-1, 70)(rng);
    const auto m = mask(causal, left, right);
    ASSERT_EQ(cad::plan::task_cost(a, b, len, m), brute_cost(a, b, len, m))
        << "[" << a << ", " << b << ") of " << len << " causal=" << causal << " window=(" << left << ", " << right << ")";
  }
}

TEST(WindowCost, CausalQueryCostsMinOfPositionAndWindow) {
  const auto m = mask(true, 10, -1);
  EXPECT_EQ(cad::plan::task_cost(0, 1, 100, m), 1);
  EXPECT_EQ(cad::plan::task_cost(5, 6, 100, m), 6);
  EXPECT_EQ(cad::plan::task_cost(50, 51, 100, m), 11);
  EXPECT_EQ(cad::plan::task_cost(0, 100, 100, m), 55 + 90 * 11);
  // No window: the plain formulas.
  EXPECT_EQ(cad::plan::task_cost(3, 9, 20, mask(true, -1, -1)), cad::plan::task_cost(3, 9, 20, true));
  EXPECT_EQ(cad::plan::task_cost(3, 9, 20, mask(false, -1, -1)), 6 * 20);
}

TEST(WindowCost, KvRangeStartsAtTheWindow) {
  const auto r = cad::plan::task_kv_range(100, 120, 500, mask(true, 30, -1));
  EXPECT_EQ(r.begin, 70);
  EXPECT_EQ(r.end, 120);
  EXPECT_EQ(cad::plan::task_kv_range(10, 20, 500, mask(true, 30, -1)).begin, 0);
  const auto nc = cad::plan::task_kv_range(100, 120, 500, mask(false, 5, 7));
  EXPECT_EQ(nc.begin, 95);
  EXPECT_EQ(nc.end, 127);
  EXPECT_TRUE(cad::plan::task_kv_range(5, 5, 500, mask(true, 3, -1)).empty());
}

// Windows at the int64 limits hide no key of any document: the cost and the KV range are exactly the
// unwindowed ones (a model computing `q_end + right` or `right * ...` wraps there).
TEST(WindowCost, LimitsOfInt64AreNoLimit) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t lens[] = {1, 7, 60, 1000003};
  for (int64_t len : lens) {
    for (int64_t a : {int64_t{0}, len / 3, len - 1}) {
      const int64_t b = len;
      SCOPED_TRACE("[" + std::to_string(a) + ", " + std::to_string(b) + ") of " + std::to_string(len));
      for (const auto& m : {mask(false, -1, kMax), mask(false, kMax, -1), mask(false, kMax, kMax),
                            mask(false, kMax - 1, kMax - 1)}) {
        EXPECT_EQ(cad::plan::task_cost(a, b, len, m), (b - a) * len);
        const auto r = cad::plan::task_kv_range(a, b, len, m);
        EXPECT_EQ(r.begin, 0);
        EXPECT_EQ(r.end, len);
      }
      for (const auto& m : {mask(true, kMax, -1), mask(true, kMax - 1, 0)}) {
        EXPECT_EQ(cad::plan::task_cost(a, b, len, m), cad::plan::task_cost(a, b, len, true));
        const auto r = cad::plan::task_kv_range(a, b, len, m);
        EXPECT_EQ(r.begin, 0);
        EXPECT_EQ(r.end, b);
      }
      if (len <= 60) {  // the key-by-key count at the limits too
        EXPECT_EQ(cad::plan::task_cost(a, b, len, mask(false, 3, kMax)), brute_cost(a, b, len, mask(false, 3, kMax)));
        EXPECT_EQ(cad::plan::task_cost(a, b, len, mask(false, kMax, 2)), brute_cost(a, b, len, mask(false, kMax, 2)));
      }
    }
  }
  // A finite side stays exact next to an infinite one.
  const auto r = cad::plan::task_kv_range(100, 120, 500, mask(false, 5, kMax));
  EXPECT_EQ(r.begin, 95);
  EXPECT_EQ(r.end, 500);
}

// Two tasks of one document on server 1 away from rank 0: the server holds one copy of the hull of their
// KV ranges, [q_begin(first) - left, q_end(last)), and the document's other tokens do not move.
TEST(WindowCost, EvaluatePlanShipsTheHullOfTheWindowedRangesOnce) {
  const RankPieces ranks = {{{0, 1000, 0, 1000}}, {}};
  const std::vector<cad_task_v1_t> tasks = {{0, 0, 400, 0, 0}, {0, 400, 500, 1, 0}, {0, 500, 600, 0, 0},
                                            {0, 600, 700, 1, 0}, {0, 700, 1000, 0, 0}};
  auto m = mask(true, 50, -1);
  const auto st = cad::plan::evaluate_plan(ranks, 2, tasks.data(), static_cast<int64_t>(tasks.size()), m);
  EXPECT_EQ(st.kv_tokens_moved, 700 - 350);
  EXPECT_EQ(st.q_rows_moved, 200);
  EXPECT_EQ(st.cost[1], cad::plan::task_cost(400, 500, 1000, m) + cad::plan::task_cost(600, 700, 1000, m));
  EXPECT_EQ(st.cost[1], 200 * 51);
  m.window_left = -1;  // without the window: the whole prefix [0, 700)
  EXPECT_EQ(cad::plan::evaluate_plan(ranks, 2, tasks.data(), static_cast<int64_t>(tasks.size()), m).kv_tokens_moved, 700);
}

// A skewed batch: one long document on rank 0, short ones elsewhere.
RankPieces skewed() {
  RankPieces ranks = {{{0, 40000, 0, 40000}}, {}, {}, {}};
  for (int r = 1; r < 4; ++r)
    for (int d = 0; d < 20; ++d) ranks[static_cast<size_t>(r)].push_back({100 * r + d, 500 + 7 * d, 0, 500 + 7 * d});
  return ranks;
}

TEST(WindowBalancers, EveryBalancerPlansAWindowedBatch) {
  const RankPieces ranks = skewed();
  for (const auto& name : all_balancers()) {
    LoadedBalancer balancer(plugin_path(name));
    for (int64_t left : {0, 127, 4096, 100000}) {
      auto cost = cost_params(128);
      cost.window_flags = CAD_WINDOW_GIVEN;
      cost.window_left = left;
      const PlanResult plan = balancer.plan(ranks, 4, cost);
      ASSERT_EQ(plan.status, CAD_STATUS_OK) << name << " window " << left << ": " << plan.error;
      // Every document's queries planned exactly once (the plugin checks this too; here from outside).
      std::map<int64_t, int64_t> covered;
      for (const auto& t : plan.tasks) covered[t.doc_id] += t.q_end - t.q_begin;
      for (const auto& r : ranks)
        for (const auto& p : r) EXPECT_EQ(covered[p.doc_id], p.doc_len) << name;
    }
  }
}

TEST(WindowBalancers, PrefixAwareAndDistcaBalanceTheWindowedCost) {
  const RankPieces ranks = skewed();
  auto cost = cost_params(128);
  cost.window_flags = CAD_WINDOW_GIVEN;
  cost.window_left = 1024;
  const auto model = cad::plan::model_params(cost);
  const double before = cad::plan::imbalance_of(cad::plan::colocated_cost(ranks, model));
  EXPECT_GT(before, 2.0);
  for (const char* name : {"prefix_aware", "distca"}) {
    LoadedBalancer balancer(plugin_path(name));
    const PlanResult plan = balancer.plan(ranks, 4, cost);
    ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
    const auto st = cad::plan::evaluate_plan(ranks, 4, plan.tasks.data(), static_cast<int64_t>(plan.tasks.size()), model);
    EXPECT_LE(st.imbalance, 1.15) << name;
    // Windowed tasks fetch at most their window of KV besides their queries.
    EXPECT_LE(st.kv_tokens_moved, st.q_rows_moved + 1024 * static_cast<int64_t>(plan.tasks.size())) << name;
  }
}

TEST(WindowBalancers, BadWindowsAndOldStructs) {
  LoadedBalancer balancer(plugin_path("prefix_aware"));
  const RankPieces ranks = skewed();
  auto cost = cost_params(128);
  cost.window_flags = CAD_WINDOW_GIVEN;
  cost.window_left = -3;
  PlanResult plan = balancer.plan(ranks, 4, cost);
  EXPECT_EQ(plan.status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(plan.error.find("window_left"), std::string::npos) << plan.error;
  cost.window_left = 10;
  cost.window_right = 4;  // causal: no key after the query
  plan = balancer.plan(ranks, 4, cost);
  EXPECT_EQ(plan.status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(plan.error.find("window_right"), std::string::npos) << plan.error;
  // Unknown flag bits and a nonzero reserved word are refused, naming the field.
  cost.window_right = -1;
  cost.window_flags = CAD_WINDOW_GIVEN | 2u;
  plan = balancer.plan(ranks, 4, cost);
  EXPECT_EQ(plan.status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(plan.error.find("window_flags"), std::string::npos) << plan.error;
  cost.window_flags = CAD_WINDOW_GIVEN;
  cost.reserved_v1_2 = 1;
  plan = balancer.plan(ranks, 4, cost);
  EXPECT_EQ(plan.status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(plan.error.find("reserved_v1_2"), std::string::npos) << plan.error;
  cost.reserved_v1_2 = 0;
  // Without CAD_WINDOW_GIVEN the window fields are not read: no window, whatever they hold.
  cost.window_flags = 0;
  cost.window_left = -3;
  cost.window_right = 4;
  plan = balancer.plan(ranks, 4, cost);
  EXPECT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  EXPECT_FALSE(cad::plan::model_params(cost).windowed());
  // A v1.1 caller's struct ends before the window: whatever lies there is not read.
  cost.struct_size = CAD_COST_PARAMS_V1_1_SIZE;
  cost.window_flags = CAD_WINDOW_GIVEN;
  cost.window_left = -3;
  plan = balancer.plan(ranks, 4, cost);
  EXPECT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
}

// Every balancer plans windows at the int64 limits as no window: each server's cost under that window
// equals its cost without one, and every document is covered once.
TEST(WindowBalancers, WindowsAtTheInt64LimitsPlanAsNoWindow) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const RankPieces ranks = skewed();
  for (const auto& name : all_balancers()) {
    LoadedBalancer balancer(plugin_path(name));
    for (int causal : {1, 0}) {
      for (int64_t left : {kMax, kMax - 1, int64_t{-1}}) {
        auto cost = cost_params(128);
        cost.causal = causal;
        cost.window_flags = CAD_WINDOW_GIVEN;
        cost.window_left = left;
        cost.window_right = causal ? -1 : kMax;
        SCOPED_TRACE(name + " causal=" + std::to_string(causal) + " left=" + std::to_string(left));
        const PlanResult plan = balancer.plan(ranks, 4, cost);
        ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
        auto plain = cost;
        plain.window_flags = 0;
        const auto at_limit = cad::plan::evaluate_plan(ranks, 4, plan.tasks.data(),
                                                       static_cast<int64_t>(plan.tasks.size()), cad::plan::model_params(cost));
        const auto unwindowed = cad::plan::evaluate_plan(ranks, 4, plan.tasks.data(),
                                                         static_cast<int64_t>(plan.tasks.size()), cad::plan::model_params(plain));
        EXPECT_EQ(at_limit.cost, unwindowed.cost);
        EXPECT_EQ(at_limit.kv_tokens_moved, unwindowed.kv_tokens_moved);
        std::map<int64_t, int64_t> covered;
        for (const auto& t : plan.tasks) covered[t.doc_id] += t.q_end - t.q_begin;
        for (const auto& r : ranks)
          for (const auto& p : r) EXPECT_EQ(covered[p.doc_id], p.doc_len);
      }
    }
  }
}

// A cost struct that holds window_flags but not window_right, with CAD_WINDOW_GIVEN set, is refused by
// every balancer, naming the struct and its size (run as no window it would price other attention).
TEST(WindowBalancers, CostParamsTooShortForTheirFlagsAreRefused) {
  const RankPieces ranks = skewed();
  for (const auto& name : all_balancers()) {
    LoadedBalancer balancer(plugin_path(name));
    for (size_t size : {offsetof(cad_cost_params_v1_t, window_flags) + 4, offsetof(cad_cost_params_v1_t, window_left),
                        offsetof(cad_cost_params_v1_t, window_right)}) {
      auto cost = cost_params(128);
      cost.struct_size = size;
      cost.window_flags = CAD_WINDOW_GIVEN;
      cost.window_left = 100;
      cost.window_right = -1;
      const PlanResult plan = balancer.plan(ranks, 4, cost);
      EXPECT_EQ(plan.status, CAD_STATUS_ABI_MISMATCH) << name << " size " << size;
      EXPECT_NE(plan.error.find("cad_cost_params_v1_t.struct_size is " + std::to_string(size)), std::string::npos)
          << name << ": " << plan.error;
      cost.window_flags = 0;
      EXPECT_EQ(balancer.plan(ranks, 4, cost).status, CAD_STATUS_OK) << name << " size " << size;
    }
  }
}

// A zero-initialised v1.2 cost struct (struct_size = sizeof) means no window: the same plan as before the
// window fields existed, not a window of 0; with CAD_WINDOW_GIVEN, (0, 0) is a window of 0.
TEST(WindowBalancers, ZeroInitialisedCostMeansNoWindow) {
  const RankPieces ranks = skewed();
  auto zeroed = cost_params(128);
  ASSERT_EQ(zeroed.struct_size, sizeof(cad_cost_params_v1_t));
  ASSERT_EQ(zeroed.window_flags, 0u);
  ASSERT_EQ(zeroed.window_left, 0);
  ASSERT_EQ(zeroed.window_right, 0);
  EXPECT_FALSE(cad::plan::model_params(zeroed).windowed());
  auto old = zeroed;
  old.struct_size = CAD_COST_PARAMS_V1_1_SIZE;
  auto given = zeroed;
  given.window_flags = CAD_WINDOW_GIVEN;
  EXPECT_TRUE(cad::plan::model_params(given).windowed());
  EXPECT_EQ(cad::plan::model_params(given).window_left, 0);
  for (const auto& name : all_balancers()) {
    LoadedBalancer balancer(plugin_path(name));
    const PlanResult a = balancer.plan(ranks, 4, zeroed), b = balancer.plan(ranks, 4, old);
    ASSERT_EQ(a.status, CAD_STATUS_OK) << name << ": " << a.error;
    ASSERT_EQ(b.status, CAD_STATUS_OK) << name << ": " << b.error;
    ASSERT_EQ(a.tasks.size(), b.tasks.size()) << name;
    for (size_t i = 0; i < a.tasks.size(); ++i) {
      EXPECT_EQ(std::memcmp(&a.tasks[i], &b.tasks[i], sizeof(cad_task_v1_t)), 0) << name << " task " << i;
    }
    EXPECT_EQ(balancer.plan(ranks, 4, given).status, CAD_STATUS_OK) << name;
  }
}

TEST(WindowBalancers, RateTablesAreRefusedForWindows) {
  LoadedBalancer balancer(plugin_path("prefix_aware"),
                          std::string("{\"rate_table\": \"") + CAD_SOURCE_DIR + "/configs/calibration/h200.json\"}");
  auto cost = cost_params(128);
  cost.window_flags = CAD_WINDOW_GIVEN;
  cost.window_left = 100;
  const PlanResult plan = balancer.plan(skewed(), 4, cost);
  EXPECT_EQ(plan.status, CAD_STATUS_UNSUPPORTED);
  EXPECT_NE(plan.error.find("sliding window"), std::string::npos) << plan.error;
}

}  // namespace
