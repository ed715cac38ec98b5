// What each server of a plan holds (workload/server_memory.h): the K/V rows of each document's prefix it
// needs and the bytes other ranks send it, equal to the plan model's memory_received; the least any plan
// needs for a document; and the refusals, which name the document, the rank and the bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "long_docs.h"
#include "plan_model.h"
#include "server_memory.h"

namespace {

using cad::plan::ModelParams;
using cad::workload::RankPieces;

// Every piece computed by its owner: colocated over pieces, the all-gather-KV context parallelism.
std::vector<cad_task_v1_t> on_owners(const RankPieces& ranks) {
  std::vector<cad_task_v1_t> tasks;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& p : ranks[r]) {
      tasks.push_back({p.doc_id, p.offset_in_doc, p.offset_in_doc + p.len, static_cast<int32_t>(r), 0});
    }
  }
  return tasks;
}

void expect_matches_plan_model(const RankPieces& ranks, const std::vector<cad_task_v1_t>& tasks, const ModelParams& m,
                               const cad::workload::ServerMemory& memory) {
  const int32_t servers = static_cast<int32_t>(ranks.size());
  const cad::plan::PlanStats st =
      cad::plan::evaluate_plan(ranks, servers, tasks.data(), static_cast<int64_t>(tasks.size()), m);
  EXPECT_EQ(memory.foreign_bytes, st.memory_received);
}

TEST(ServerMemory, LastPieceOfALongDocumentHoldsItsWholePrefix) {
  const ModelParams m;  // Hq 32, Hkv 8, D 128, 2 bytes: 4096 K/V bytes a token
  ASSERT_EQ(m.kv_token_bytes(), 4096);
  const RankPieces ranks = cad::workload::pack_whole({16384}, 2048, 8);  // 1M over 8 x 128K, scaled down 64x
  const auto tasks = on_owners(ranks);
  const auto memory = cad::workload::server_memory(ranks, 8, tasks.data(), static_cast<int64_t>(tasks.size()), m);
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(memory.kv_rows[r], (r + 1) * 2048) << "server " << r;
    EXPECT_EQ(memory.kv_bytes[r], (r + 1) * 2048 * 4096) << "server " << r;
    EXPECT_EQ(memory.foreign_bytes[r], r * 2048 * 4096) << "server " << r;
    EXPECT_EQ(memory.largest[r].doc_id, 0);
    EXPECT_EQ(memory.largest[r].foreign_q_rows, 0);
  }
  expect_matches_plan_model(ranks, tasks, m, memory);
}

TEST(ServerMemory, MovedQueriesAndSharedPrefixesAgreeWithThePlanModel) {
  const ModelParams m;
  const RankPieces ranks = cad::workload::pack_whole({3000, 1000, 4192}, 2048, 4);
  // Document 0 [0, 3000): rank 0 [0, 2048), rank 1 [2048, 3000). Document 2 [0, 4192): ranks 1-3.
  std::vector<cad_task_v1_t> tasks = {
      {0, 0, 1000, 1, 0},     {0, 1000, 3000, 1, 0},  // document 0 all on server 1
      {1, 0, 1000, 3, 0},                             // document 1 (rank 1) on server 3
      {2, 0, 96, 1, 0},       {2, 96, 2144, 2, 0},    {2, 2144, 4192, 0, 0},
  };
  const auto memory = cad::workload::server_memory(ranks, 4, tasks.data(), static_cast<int64_t>(tasks.size()), m);
  expect_matches_plan_model(ranks, tasks, m, memory);
  // Server 1 holds document 0's whole prefix once (3000 rows; 2048 of them rank 0's) and 96 rows of document 2.
  EXPECT_EQ(memory.kv_rows[1], 3000 + 96);
  EXPECT_EQ(memory.largest[1].doc_id, 0);
  EXPECT_EQ(memory.largest[1].foreign_kv_rows, 2048);
  EXPECT_EQ(memory.largest[1].foreign_q_rows, 2048);
  EXPECT_EQ(memory.largest[1].foreign_bytes, 2048 * m.kv_token_bytes() + 2048 * m.q_memory_bytes());
  EXPECT_EQ(memory.kv_rows[0], 4192);  // document 2's last queries need all of it
}

TEST(ServerMemory, SlidingWindowHoldsOnlyTheWindow) {
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof cost;
  cost.num_q_heads = 32;
  cost.num_kv_heads = 8;
  cost.head_dim = 128;
  cost.bytes_per_element = 2;
  cost.causal = 1;
  cost.window_left = 100;
  cost.window_right = -1;
  cost.window_flags = CAD_WINDOW_GIVEN;
  const ModelParams m = cad::plan::model_params(cost);
  const RankPieces ranks = cad::workload::pack_whole({8192}, 2048, 4);
  const auto tasks = on_owners(ranks);
  const auto memory = cad::workload::server_memory(ranks, 4, tasks.data(), static_cast<int64_t>(tasks.size()), m);
  EXPECT_EQ(memory.kv_rows[0], 2048);
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(memory.kv_rows[r], 2148) << "server " << r;
    EXPECT_EQ(memory.foreign_bytes[r], 100 * m.kv_token_bytes()) << "server " << r;
  }
  expect_matches_plan_model(ranks, tasks, m, memory);
  const auto floor = cad::workload::largest_memory_floor(ranks, m);
  EXPECT_EQ(floor.keys.begin, 8192 - 1 - 100);
  EXPECT_EQ(floor.bytes, 0);  // rank 3 holds the last query's whole window
}

TEST(ServerMemory, FloorOfAMillionTokenDocumentAndTheRefusals) {
  const ModelParams m;
  const RankPieces ranks = cad::workload::pack_whole({int64_t{1} << 20}, int64_t{1} << 17, 8);
  const auto floor = cad::workload::largest_memory_floor(ranks, m);
  EXPECT_EQ(floor.doc_id, 0);
  EXPECT_EQ(floor.rank, 7);  // it holds the last query and the most keys (ties: the lowest rank)
  EXPECT_EQ(floor.held, int64_t{1} << 17);
  const int64_t bytes = ((int64_t{1} << 20) - (int64_t{1} << 17)) * 4096;  // 3.5 GiB of K/V from ranks 0-6
  EXPECT_EQ(floor.bytes, bytes);
  EXPECT_EQ(cad::workload::layout_refusal(floor, bytes), "");
  EXPECT_EQ(cad::workload::layout_refusal(floor, 0), "");  // no cap
  const std::string no = cad::workload::layout_refusal(floor, bytes - 1);
  EXPECT_NE(no.find("document 0 (1048576 tokens)"), std::string::npos) << no;
  EXPECT_NE(no.find("rank 7"), std::string::npos) << no;
  EXPECT_NE(no.find("receive " + std::to_string(bytes) + " bytes"), std::string::npos) << no;

  const auto tasks = on_owners(ranks);
  const auto memory = cad::workload::server_memory(ranks, 8, tasks.data(), static_cast<int64_t>(tasks.size()), m);
  EXPECT_EQ(cad::workload::plan_refusal(memory, bytes), "");
  const std::string over = cad::workload::plan_refusal(memory, bytes / 2);
  // Server 4 is the first to receive more than 1.75 GiB (4 x 128K rows of K/V).
  EXPECT_NE(over.find("server (rank) 4 would receive " + std::to_string(4 * (int64_t{1} << 17) * 4096) + " bytes"),
            std::string::npos)
      << over;
  EXPECT_NE(over.find("document 0"), std::string::npos) << over;
}

TEST(ServerMemory, BadTasksAreRefusedNamingThem) {
  const ModelParams m;
  const RankPieces ranks = cad::workload::pack_whole({64}, 32, 2);
  const std::vector<cad_task_v1_t> unknown_doc = {{5, 0, 64, 0, 0}};
  EXPECT_THROW(cad::workload::server_memory(ranks, 2, unknown_doc.data(), 1, m), std::invalid_argument);
  const std::vector<cad_task_v1_t> bad_server = {{0, 0, 64, 2, 0}};
  EXPECT_THROW(cad::workload::server_memory(ranks, 2, bad_server.data(), 1, m), std::invalid_argument);
}

}  // namespace
