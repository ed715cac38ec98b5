// plan_model_test.cpp -- the cost and traffic model on layouts small enough to count by hand.
#include <gtest/gtest.h>

#include "plan_model.h"

namespace {

using cad::plan::ModelParams;
using cad::plan::RankPieces;

cad_task_v1_t task(int64_t doc, int64_t b, int64_t e, int32_t server) { return {doc, b, e, server, 0}; }

ModelParams params(bool causal = true) {
  ModelParams p;
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 8;
  p.bytes_per_element = 2;
  p.causal = causal;
  return p;
}

TEST(PlanModel, CausalCostCountsEveryVisibleKey) {
  // Brute force: query p sees keys 0..p.
  for (int64_t b = 0; b < 9; ++b) {
    for (int64_t e = b + 1; e <= 9; ++e) {
      int64_t brute = 0;
      for (int64_t p = b; p < e; ++p) brute += p + 1;
      EXPECT_EQ(cad::plan::task_cost(b, e, 9, true), brute) << b << " " << e;
      EXPECT_EQ(cad::plan::task_cost(b, e, 9, false), (e - b) * 9);
    }
  }
  EXPECT_DOUBLE_EQ(cad::plan::entries_to_flops(10, params()), 4.0 * 8 * 4 * 10);
}

TEST(PlanModel, ColocatedPlanMovesNothingForWholeDocuments) {
  RankPieces ranks = {{{1, 10, 0, 10}}, {{2, 6, 0, 6}}};
  std::vector<cad_task_v1_t> tasks = {task(1, 0, 10, 0), task(2, 0, 6, 1)};
  const auto st = cad::plan::evaluate_plan(ranks, 2, tasks.data(), 2, params());
  EXPECT_EQ(st.total_bytes, 0);
  EXPECT_EQ(st.cost[0], 55);
  EXPECT_EQ(st.cost[1], 21);
  EXPECT_DOUBLE_EQ(st.imbalance, 55.0 / 38.0);
}

TEST(PlanModel, MovedTailShipsQueriesOutputsAndThePrefixOnce) {
  const ModelParams p = params();
  RankPieces ranks = {{{1, 10, 0, 10}}, {}};
  // Two shards of document 1 on server 1 share one KV prefix [0, 10).
  std::vector<cad_task_v1_t> tasks = {task(1, 0, 2, 0), task(1, 2, 4, 1), task(1, 4, 6, 0), task(1, 6, 10, 1)};
  const auto st = cad::plan::evaluate_plan(ranks, 2, tasks.data(), 4, p);
  const int64_t rows = 2 + 4;
  EXPECT_EQ(st.link_bytes[0 * 2 + 1], rows * p.q_row_bytes() + 10 * p.kv_token_bytes());
  EXPECT_EQ(st.link_bytes[1 * 2 + 0], rows * (p.o_row_bytes() + p.lse_row_bytes()));
  EXPECT_EQ(st.total_bytes, st.link_bytes[1] + st.link_bytes[2]);
  EXPECT_EQ(st.memory_received[1], rows * p.q_memory_bytes() + 10 * p.kv_token_bytes());
  EXPECT_EQ(st.bytes_sent[0], st.link_bytes[1]);
  EXPECT_EQ(st.bytes_received[0], st.link_bytes[2]);
}

TEST(PlanModel, PrefixStopsAtTheLastQueryAndSkipsHeldTokens) {
  const ModelParams p = params();
  // Document 1 is split by the host: [0, 4) on rank 0, [4, 10) on rank 1.
  RankPieces ranks = {{{1, 10, 0, 4}}, {{1, 10, 4, 6}}, {}};
  // Server 2 computes [4, 7): needs KV [0, 7) = 4 tokens from rank 0 and 3 from rank 1.
  std::vector<cad_task_v1_t> tasks = {task(1, 0, 4, 0), task(1, 4, 7, 2), task(1, 7, 10, 1)};
  const auto st = cad::plan::evaluate_plan(ranks, 3, tasks.data(), 3, p);
  EXPECT_EQ(st.link_bytes[0 * 3 + 2], 4 * p.kv_token_bytes());
  EXPECT_EQ(st.link_bytes[1 * 3 + 2], 3 * p.q_row_bytes() + 3 * p.kv_token_bytes());
  // Rank 1 computes [7, 10) itself but needs the head [0, 4) from rank 0 (tokens 4..9 it holds).
  EXPECT_EQ(st.link_bytes[0 * 3 + 1], 4 * p.kv_token_bytes());
  EXPECT_EQ(st.link_bytes[2 * 3 + 1], 3 * (p.o_row_bytes() + p.lse_row_bytes()));
}

TEST(PlanModel, NonCausalNeedsTheWholeDocument) {
  const ModelParams p = params(false);
  RankPieces ranks = {{{1, 10, 0, 10}}, {}};
  std::vector<cad_task_v1_t> tasks = {task(1, 0, 8, 0), task(1, 8, 10, 1)};
  const auto st = cad::plan::evaluate_plan(ranks, 2, tasks.data(), 2, p);
  EXPECT_EQ(st.cost[1], 2 * 10);
  EXPECT_EQ(st.link_bytes[1], 2 * p.q_row_bytes() + 10 * p.kv_token_bytes());
}

TEST(PlanModel, UnknownDocumentIsRefused) {
  RankPieces ranks = {{{1, 10, 0, 10}}};
  std::vector<cad_task_v1_t> tasks = {task(2, 0, 10, 0)};
  EXPECT_THROW(cad::plan::evaluate_plan(ranks, 1, tasks.data(), 1, params()), std::invalid_argument);
}

}  // namespace
