// memory_cap_test.cpp -- prefix_aware under a per-server memory cap: a plan whenever the colocated plan
// fits, within the cap, balance degrading gracefully as the cap tightens from the uncapped peak down to
// colocated's; below colocated's peak a refusal that says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "balancer_harness.h"
#include "batch_recipe.h"
#include "plugin_paths.h"

namespace {

using namespace cad::balancer_test;

// A heavy-tailed batch packed in order into `ranks` buffers: documents crossing a buffer boundary are
// split across ranks by the host, so even the colocated plan ships some KV (its memory is not 0).
RankPieces heavy_tail_batch(uint64_t seed, int32_t ranks, int64_t context) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> lengths;
  int64_t total = 0;
  while (total < context * ranks) {
    const uint64_t kind = rng() % 10;
    const int64_t len = kind < 7   ? 100 + static_cast<int64_t>(rng() % 1900)
                        : kind < 9 ? 2000 + static_cast<int64_t>(rng() % 14000)
                                   : 16000 + static_cast<int64_t>(rng() % 40000);
    lengths.push_back(len);
    total += len;
  }
  return cad::workload::pack(lengths, context, ranks);
}

cad::plan::PlanStats stats(const RankPieces& ranks, int32_t servers, const PlanResult& plan,
                           const cad_cost_params_v1_t& cost) {
  return cad::plan::evaluate_plan(ranks, servers, plan.tasks.data(), static_cast<int64_t>(plan.tasks.size()),
                                  cad::plan::model_params(cost));
}

int64_t peak(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

TEST(MemoryCapSweep, PrefixAwarePlansDownToColocatedsPeakAndRefusesBelow) {
  LoadedBalancer ours(plugin_path("prefix_aware"));
  LoadedBalancer colocated(plugin_path("colocated"));
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const int32_t n = 16;
    const RankPieces ranks = heavy_tail_batch(seed, n, 32768);
    const auto free_cost = cost_params(128);
    const PlanResult free_plan = ours.plan(ranks, n, free_cost);
    ASSERT_EQ(free_plan.status, CAD_STATUS_OK) << free_plan.error;
    const auto free_stats = stats(ranks, n, free_plan, free_cost);
    const PlanResult co = colocated.plan(ranks, n, free_cost);
    const auto co_stats = stats(ranks, n, co, free_cost);
    const int64_t top = peak(free_stats.memory_received), floor = peak(co_stats.memory_received);
    ASSERT_GT(floor, 0) << "the batch should split some documents across ranks";
    ASSERT_GT(top, 2 * floor);
    ASSERT_GT(co_stats.imbalance, 1.5);

    double previous = free_stats.imbalance;
    double sum_upper_half = 0;
    for (int step = 0; step <= 10; ++step) {  // caps from the uncapped peak down to colocated's
      const int64_t cap = floor + (top - floor) * (10 - step) / 10;
      SCOPED_TRACE("cap " + std::to_string(cap) + " (step " + std::to_string(step) + ")");
      const auto cost = cost_params(128, cap);
      const PlanResult plan = ours.plan(ranks, n, cost);
      ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
      const auto st = stats(ranks, n, plan, cost);
      EXPECT_LE(peak(st.memory_received), cap);
      EXPECT_LE(st.imbalance, co_stats.imbalance + 1e-9);
      if (step == 0) {
        EXPECT_LE(st.imbalance, 1.05);
      }
      if (step <= 5) sum_upper_half += st.imbalance;
      // Graceful: a tighter cap may cost balance, but not a jump to colocated's in one step.
      EXPECT_LE(st.imbalance, previous + 0.5 * (co_stats.imbalance - 1.0)) << "previous step " << previous;
      previous = st.imbalance;
    }
    // Caps down to half way between the uncapped peak and colocated's keep most of the balance.
    EXPECT_LE(sum_upper_half / 6, 1.0 + 0.25 * (co_stats.imbalance - 1.0));

    // Below colocated's peak no plan prefix_aware builds can fit: refused, naming the server and why.
    const PlanResult refused = ours.plan(ranks, n, cost_params(128, floor - 1));
    EXPECT_EQ(refused.status, CAD_STATUS_UNSUPPORTED);
    EXPECT_NE(refused.error.find("no plan fits memory_cap_bytes = " + std::to_string(floor - 1)), std::string::npos)
        << refused.error;
    EXPECT_NE(refused.error.find("with every piece on its owner"), std::string::npos) << refused.error;
  }
}

}  // namespace
