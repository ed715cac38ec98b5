// From a batch and a plan to per-rank work: balancing groups cut documents at their edge, the context-
// parallel layout is the plan's, and bytes/shards per rank match hand counts.
#include <gtest/gtest.h>

#include <vector>

#include "attention_rates.h"
#include "plan_work.h"

namespace sim = cad::simulate;

namespace {

cad_piece_v1_t piece(int64_t doc, int64_t doc_len, int64_t offset, int64_t len) {
  cad_piece_v1_t p{};
  p.doc_id = doc;
  p.doc_len = doc_len;
  p.offset_in_doc = offset;
  p.len = len;
  return p;
}

cad_task_v1_t task(int64_t doc, int64_t begin, int64_t end, int32_t server) {
  cad_task_v1_t t{};
  t.doc_id = doc;
  t.q_begin = begin;
  t.q_end = end;
  t.server = server;
  return t;
}

// r0: doc 0 [0, 6) of 10; r1: doc 0 [6, 10), doc 1 [0, 3) of 5; r2: doc 1 [3, 5).
cad::plan::RankPieces three_ranks() {
  return {{piece(0, 10, 0, 6)}, {piece(0, 10, 6, 4), piece(1, 5, 0, 3)}, {piece(1, 5, 3, 2)}};
}

}  // namespace

TEST(SimulatePlanWork, GroupsCutDocumentsAtTheirEdge) {
  const cad::plan::RankPieces g = sim::group_pieces(three_ranks(), 1, 3);
  ASSERT_EQ(g.size(), 2u);
  ASSERT_EQ(g[0].size(), 2u);
  EXPECT_EQ(g[0][0].doc_len, 4);        // doc 0's tail alone: a 4-token document
  EXPECT_EQ(g[0][0].offset_in_doc, 0);
  EXPECT_EQ(g[0][1].doc_len, 5);        // doc 1 is whole inside the group
  EXPECT_EQ(g[1][0].offset_in_doc, 3);
  const cad::plan::RankPieces first = sim::group_pieces(three_ranks(), 0, 1);
  EXPECT_EQ(first[0][0].doc_len, 6);
  const cad::plan::RankPieces all = sim::group_pieces(three_ranks(), 0, 3);
  EXPECT_EQ(all[1][0].doc_len, 10);     // nothing cut
  EXPECT_EQ(all[1][0].offset_in_doc, 6);
}

TEST(SimulatePlanWork, DocumentsPerRank) {
  const cad::plan::RankPieces d = sim::documents_per_rank(three_ranks());
  ASSERT_EQ(d[1].size(), 2u);
  EXPECT_EQ(d[0][0].doc_id, 0);
  EXPECT_EQ(d[1][0].doc_id, 1);  // doc 0's tail is a document of its own
  EXPECT_EQ(d[1][0].doc_len, 4);
  EXPECT_EQ(d[1][0].offset_in_doc, 0);
  EXPECT_EQ(d[2][0].doc_id, 3);
  EXPECT_EQ(d[2][0].doc_len, 2);
}

TEST(SimulatePlanWork, ContextParallelLayoutIsThePlan) {
  const cad::plan::RankPieces pieces = {{piece(0, 8, 0, 8)}, {}};
  const std::vector<cad_task_v1_t> tasks = {task(0, 0, 2, 0), task(0, 6, 8, 0), task(0, 2, 6, 1)};
  const cad::plan::RankPieces l = sim::context_parallel_layout(pieces, tasks, 2);
  ASSERT_EQ(l[0].size(), 2u);
  EXPECT_EQ(l[0][1].offset_in_doc, 6);
  EXPECT_EQ(l[0][1].len, 2);
  EXPECT_EQ(l[1][0].doc_len, 8);
  EXPECT_EQ(l[1][0].len, 4);
  // No query moves on that layout; rank 0 needs K/V [2, 6) from rank 1 for its tail chunk.
  cad::plan::ModelParams p;
  p.num_q_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = 2;
  p.bytes_per_element = 2;  // KV token 8 bytes
  const auto rates = sim::constant_rates(1, 1, 2.5);
  double total = 0;
  const std::vector<sim::RankWork> w = sim::rank_work(l, tasks, p, sim::Layout{2, 8, 1, 1}, 0, *rates, &total);
  EXPECT_EQ(w[0].tokens, 4);
  EXPECT_EQ(w[1].tokens, 4);
  EXPECT_DOUBLE_EQ(w[0].bytes.received_intra, 4 * 8);
  EXPECT_DOUBLE_EQ(w[1].bytes.sent_intra, 4 * 8);
  EXPECT_DOUBLE_EQ(w[1].bytes.received_intra, 2 * 8);  // server 1's [2, 6) needs K/V [0, 2) of rank 0
  EXPECT_DOUBLE_EQ(total, 6 * 8);
}

TEST(SimulatePlanWork, BytesAndShardsByHand) {
  // One 4-token document on rank 0, computed whole on server 1; Hq = Hkv = 1, D = 2, bf16:
  // Q row 4 B, O row 4 B, LSE 4 B, K/V token 8 B. Rank 0 sends 4 Q rows + 4 K/V tokens = 48 B and gets
  // 4 x (O + LSE) = 32 B back.
  const cad::plan::RankPieces pieces = {{piece(0, 4, 0, 4)}, {}};
  const std::vector<cad_task_v1_t> tasks = {task(0, 0, 4, 1)};
  cad::plan::ModelParams p;
  p.num_q_heads = 1;
  p.num_kv_heads = 1;
  p.head_dim = 2;
  p.bytes_per_element = 2;
  const auto rates = sim::constant_rates(1, 2, 2.5);  // TFLOP/s

  double total = 0;
  // One GPU per node: every byte crosses the network.
  std::vector<sim::RankWork> w = sim::rank_work(pieces, tasks, p, sim::Layout{2, 1, 1, 1}, 0, *rates, &total);
  EXPECT_DOUBLE_EQ(total, 80);
  EXPECT_DOUBLE_EQ(w[0].bytes.sent_inter, 48);
  EXPECT_DOUBLE_EQ(w[0].bytes.received_inter, 32);
  EXPECT_DOUBLE_EQ(w[1].bytes.sent_inter, 32);
  EXPECT_DOUBLE_EQ(w[1].bytes.received_inter, 48);
  EXPECT_DOUBLE_EQ(w[0].bytes.sent_intra + w[1].bytes.received_intra, 0);
  EXPECT_EQ(w[0].tokens, 4);
  EXPECT_EQ(w[1].tokens, 0);
  // Causal 4x4: 10 score entries x 4 * D * Hq = 8 FLOPs each.
  EXPECT_DOUBLE_EQ(w[1].attention.fwd_flops, 80);
  EXPECT_DOUBLE_EQ(w[1].attention.fwd, 80 / 1e12);
  EXPECT_DOUBLE_EQ(w[1].attention.bwd, 200 / 2e12);
  EXPECT_DOUBLE_EQ(w[0].attention.fwd, 0);

  // Two GPUs per node: the same bytes stay inside it. Ranks 2 and 3 of a larger layout: node 1.
  w = sim::rank_work(pieces, tasks, p, sim::Layout{4, 2, 1, 1}, 2, *rates, nullptr);
  EXPECT_DOUBLE_EQ(w[0].bytes.sent_intra, 48);
  EXPECT_DOUBLE_EQ(w[1].bytes.received_intra, 48);
  EXPECT_DOUBLE_EQ(w[0].bytes.sent_inter, 0);
  // Ranks 1 and 2 of a 2-per-node layout: different nodes.
  w = sim::rank_work(pieces, tasks, p, sim::Layout{4, 2, 1, 1}, 1, *rates, nullptr);
  EXPECT_DOUBLE_EQ(w[0].bytes.sent_inter, 48);
}
