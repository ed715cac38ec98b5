// edge_cases_test.cpp -- the shapes that break balancers: a document longer than a rank's share, all
// work on one rank, host-split documents, length-1 and odd documents, empty ranks; the minimum shard
// size; the memory cap.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "balancer_harness.h"
#include "plugin_paths.h"
#include "random_layout.h"

namespace {

using namespace cad::balancer_test;

cad::plan::PlanStats stats(const RankPieces& ranks, int32_t servers, const PlanResult& plan,
                           const cad_cost_params_v1_t& cost) {
  return cad::plan::evaluate_plan(ranks, servers, plan.tasks.data(), static_cast<int64_t>(plan.tasks.size()),
                                  cad::plan::model_params(cost));
}

// A task shorter than the minimum must not have been cut out of a piece: both its ends are ends of
// pieces the host gave (it is one whole piece, or several adjacent ones merged on one server).
void expect_min_shard(const RankPieces& ranks, const PlanResult& plan, int64_t min_shard) {
  std::set<std::pair<int64_t, int64_t>> boundaries;  // (doc, token index)
  for (const auto& r : ranks)
    for (const auto& p : r) {
      boundaries.insert({p.doc_id, p.offset_in_doc});
      boundaries.insert({p.doc_id, p.offset_in_doc + p.len});
    }
  for (const auto& t : plan.tasks) {
    if (t.q_end - t.q_begin >= min_shard) continue;
    EXPECT_TRUE(boundaries.count({t.doc_id, t.q_begin}) && boundaries.count({t.doc_id, t.q_end}))
        << "task [" << t.q_begin << ", " << t.q_end << ") of document " << t.doc_id << " is shorter than "
        << min_shard << " and was cut out of a piece";
  }
}

TEST(PrefixAware, BalancesADocumentLongerThanARanksShare) {
  LoadedBalancer ours(plugin_path("prefix_aware"));
  // Rank 0 holds one 40001-token document (odd); the others hold short ones and a length-1 one.
  RankPieces ranks = {{{0, 40001, 0, 40001}}, {}, {}, {}};
  for (int r = 1; r < 4; ++r)
    for (int d = 0; d < 10; ++d) ranks[r].push_back({100 * r + d, 1000 + d, 0, 1000 + d});
  ranks[3].push_back({999, 1, 0, 1});
  const auto cost = cost_params(128);
  const PlanResult plan = ours.plan(ranks, 4, cost);
  ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  const auto st = stats(ranks, 4, plan, cost);
  EXPECT_GT(cad::plan::imbalance_of(cad::plan::colocated_cost(ranks, true)), 3.0);
  EXPECT_LE(st.imbalance, 1.05);
  expect_min_shard(ranks, plan, 128);
}

TEST(PrefixAware, BalancesHostSplitLayoutsWithEmptyRanks) {
  LoadedBalancer ours(plugin_path("prefix_aware"));
  for (uint64_t seed = 0; seed < 20; ++seed) {
    LayoutOptions o;
    o.ranks = 3 + static_cast<int32_t>(seed % 6);
    o.empty_ranks = 1 + static_cast<int32_t>(seed % 2);
    o.docs = 40;
    o.max_doc_len = 20000;
    o.split_probability = 0.5;
    const RankPieces ranks = random_layout(seed, o);
    for (bool causal : {true, false}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (causal ? " causal" : " non-causal"));
      const auto cost = cost_params(64, 0, causal);
      const PlanResult plan = ours.plan(ranks, o.ranks, cost);
      ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
      EXPECT_LE(stats(ranks, o.ranks, plan, cost).imbalance, 1.05);
      expect_min_shard(ranks, plan, 64);
    }
  }
}

TEST(MinShard, MovedShardsAndRemaindersRespectTheMinimum) {
  for (const std::string name : {"distca", "prefix_aware"}) {
    LoadedBalancer b(plugin_path(name));
    for (uint64_t seed = 100; seed < 110; ++seed) {
      LayoutOptions o;
      o.ranks = 5;
      o.docs = 30;
      o.max_doc_len = 6000;
      const RankPieces ranks = random_layout(seed, o);
      for (int64_t min_shard : {1, 100, 700}) {
        const PlanResult plan = b.plan(ranks, 5, cost_params(min_shard));
        ASSERT_EQ(plan.status, CAD_STATUS_OK) << name << ": " << plan.error;
        SCOPED_TRACE(name + " seed " + std::to_string(seed) + " min_shard " + std::to_string(min_shard));
        expect_min_shard(ranks, plan, min_shard);
      }
    }
  }
}

TEST(MinShard, ConfigOverridesTheCostParams) {
  LoadedBalancer ours(plugin_path("prefix_aware"), "{\"min_shard_tokens\": 900}");
  LayoutOptions o;
  o.ranks = 4;
  o.docs = 30;
  o.max_doc_len = 8000;
  const RankPieces ranks = random_layout(7, o);
  const PlanResult plan = ours.plan(ranks, 4, cost_params(1));
  ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  expect_min_shard(ranks, plan, 900);
}

TEST(MemoryCap, NoServerReceivesMoreThanTheCap) {
  LoadedBalancer ours(plugin_path("prefix_aware"));
  LayoutOptions o;
  o.ranks = 4;
  o.empty_ranks = 0;
  o.docs = 30;
  o.max_doc_len = 16000;
  o.split_probability = 0;
  const RankPieces ranks = random_layout(3, o);
  const PlanResult free_plan = ours.plan(ranks, 4, cost_params());
  ASSERT_EQ(free_plan.status, CAD_STATUS_OK) << free_plan.error;
  const auto free_stats = stats(ranks, 4, free_plan, cost_params());
  const int64_t most = *std::max_element(free_stats.memory_received.begin(), free_stats.memory_received.end());
  ASSERT_GT(most, 0);

  // A cap below what the uncapped plan used: the plan changes and respects it.
  const auto capped = cost_params(128, most * 3 / 4);
  const PlanResult plan = ours.plan(ranks, 4, capped);
  ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  for (int64_t m : stats(ranks, 4, plan, capped).memory_received) EXPECT_LE(m, most * 3 / 4);

  // A cap nothing can be moved under: per_doc_cp is refused, naming a server and the cap; prefix_aware
  // falls back to what fits (here: nothing moves, as no document is split, so colocated's 0 bytes).
  LoadedBalancer cp(plugin_path("per_doc_cp"));
  const PlanResult refused = cp.plan(ranks, 4, cost_params(128, 1024));
  EXPECT_EQ(refused.status, CAD_STATUS_UNSUPPORTED);
  EXPECT_NE(refused.error.find("server "), std::string::npos) << refused.error;
  EXPECT_NE(refused.error.find("memory_cap_bytes = 1024"), std::string::npos) << refused.error;
  const PlanResult tight = ours.plan(ranks, 4, cost_params(128, 1024));
  ASSERT_EQ(tight.status, CAD_STATUS_OK) << tight.error;
  for (int64_t m : stats(ranks, 4, tight, capped).memory_received) EXPECT_LE(m, 1024);
  // Colocated moves nothing when no document is split, so any cap holds.
  LoadedBalancer colocated(plugin_path("colocated"));
  EXPECT_EQ(colocated.plan(ranks, 4, cost_params(128, 1)).status, CAD_STATUS_OK);
}

TEST(PerDocCp, ServerRGetsChunksRAnd2NMinus1MinusR) {
  LoadedBalancer cp(plugin_path("per_doc_cp"));
  // 3 servers, 6 chunks of a 20-token document: sizes 4,4,3,3,3,3; a 4-token document: chunks 0..3.
  RankPieces ranks = {{{1, 20, 0, 20}}, {{2, 4, 0, 4}}, {}};
  const PlanResult plan = cp.plan(ranks, 3, cost_params());
  ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  std::vector<std::tuple<int64_t, int64_t, int64_t, int32_t>> got;
  for (const auto& t : plan.tasks) got.push_back({t.doc_id, t.q_begin, t.q_end, t.server});
  const std::vector<std::tuple<int64_t, int64_t, int64_t, int32_t>> want = {
      {1, 0, 4, 0},  {1, 17, 20, 0}, {2, 0, 1, 0}, {1, 4, 8, 1}, {1, 14, 17, 1},
      {2, 1, 2, 1},  {1, 8, 14, 2},  {2, 2, 4, 2}};
  EXPECT_EQ(got, want);
}

}  // namespace
