// distca_test.cpp -- the DistCA baseline moves the rows DistCA's planner moves (hao-ai-lab/DistCA,
// distca/planner/planner.py): query pairs cut next to the middle of a piece, later cuts next to the
// hole the earlier ones left, recipients served largest deficit first until within tolerance x mean,
// the item with the fewest elements per FLOP first. Expected plans worked out by hand (Hq 32, Hkv 8,
// D 128: 4096 Q elements per row, 2048 K+V elements per token; minimum shard 1 = DistCA's own rows).
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "balancer_harness.h"
#include "plugin_paths.h"

namespace {

using namespace cad::balancer_test;
using Task = std::tuple<int64_t, int64_t, int64_t, int32_t>;  // doc, q_begin, q_end, server

std::vector<Task> plan_of(const std::string& config, const RankPieces& ranks, int32_t servers) {
  LoadedBalancer distca(plugin_path("distca"), config);
  const PlanResult plan = distca.plan(ranks, servers, cost_params(1));
  EXPECT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  std::vector<Task> out;
  for (const auto& t : plan.tasks) out.push_back({t.doc_id, t.q_begin, t.q_end, t.server});
  return out;
}

TEST(DistcaRows, CutsNextToTheMiddleAndThenNextToTheHole) {
  // Loads 500500 (A, 1000 tokens), 5050 (C, 100), 0; mean 168516.67, tolerance 0.1: threshold 16851.67.
  // Server 2 (largest deficit) first: f = 168516.67, pair = 2*500 + 1 = 1001, k = 168 -> A [332, 668).
  // Its need is then 348.67 < threshold. Server 1: need 163466.67, donor 0 has 163815.33 left; the
  // pair still costs 332 + 668 + 1 = 1001, k = 163 -> A [169, 332) and [668, 831), next to the hole.
  const RankPieces ranks = {{{1, 1000, 0, 1000}}, {{3, 100, 0, 100}}, {}};
  const std::vector<Task> want = {{1, 0, 169, 0},   {1, 831, 1000, 0}, {1, 169, 332, 1},
                                  {1, 668, 831, 1}, {3, 0, 100, 1},    {1, 332, 668, 2}};
  EXPECT_EQ(plan_of("{\"tolerance\": 0.1}", ranks, 3), want);
}

TEST(DistcaRows, CheapestElementsPerFlopFirstAndStopsWhenNoPairFits) {
  // Rank 0 holds Q (500 tokens, 125250 entries) then P (2000, 2001000); mean 1063125, tolerance 0.
  // Priorities at f = min(surplus, need, work): Q (125250/501*4096 + 2048*501)/125250 = 16.4,
  // P (1063125/2001*4096 + 2048*2001)/1063125 = 5.9: P, k = 531 pairs of 2001 -> [469, 1531).
  // Need 594 left: P's k would be 0; Q is now cheaper per FLOP (the KV of 501 vs 2001 tokens
  // dominates): k = floor(594/501) = 1 -> Q [249, 251). Need 93: the cheapest (Q) moves no pair: stop.
  const RankPieces ranks = {{{7, 500, 0, 500}, {5, 2000, 0, 2000}}, {}};
  const std::vector<Task> want = {{5, 0, 469, 0},   {5, 1531, 2000, 0}, {7, 0, 249, 0},
                                  {7, 251, 500, 0}, {5, 469, 1531, 1},  {7, 249, 251, 1}};
  EXPECT_EQ(plan_of("{\"tolerance\": 0}", ranks, 2), want);
}

TEST(DistcaRows, PricesEachItemAtWhatItCouldMoveAndMovesWholeItemsThatFit) {
  // Loads 5050 + 1275 (documents of 100 and 50 tokens) and 0; mean 3162.5. At f = min(surplus, need,
  // work): the 100-token one (3162.5/101*4096 + 2048*101)/3162.5 = 106.0, the 50-token one (all of its
  // 1275: (1275/51*4096 + 2048*51)/1275 = 162.2) -> the 100-token one, k = 31 pairs of 101 -> [19, 81).
  // Need 31.5 left: the 50-token one is now cheaper (3396 vs 6607) but k = floor(31.5/51) = 0: stop.
  const RankPieces ranks = {{{1, 100, 0, 100}, {2, 50, 0, 50}}, {}};
  const std::vector<Task> want = {{1, 0, 19, 0}, {1, 81, 100, 0}, {2, 0, 50, 0}, {1, 19, 81, 1}};
  EXPECT_EQ(plan_of("{\"tolerance\": 0}", ranks, 2), want);
  // Loads 1275 + 55 (50 and 10 tokens), mean 665: the 50-token one (237 vs 782), k = 13 -> [12, 38);
  // need 2 left: the 10-token one is cheaper now, but 2 < its work (55) and k = floor(2/11) = 0: stop.
  const RankPieces small = {{{2, 50, 0, 50}, {4, 10, 0, 10}}, {}};
  const std::vector<Task> want_small = {{2, 0, 12, 0}, {2, 38, 50, 0}, {4, 0, 10, 0}, {2, 12, 38, 1}};
  EXPECT_EQ(plan_of("{\"tolerance\": 0}", small, 2), want_small);
  // A recipient whose need exceeds a whole small item takes it whole: rank 0 holds only two 10-token
  // documents (55 each), mean 55: the first one (host order) moves whole.
  const RankPieces whole = {{{8, 10, 0, 10}, {9, 10, 0, 10}}, {}};
  const std::vector<Task> want_whole = {{9, 0, 10, 0}, {8, 0, 10, 1}};
  EXPECT_EQ(plan_of("{\"tolerance\": 0}", whole, 2), want_whole);
}

}  // namespace
