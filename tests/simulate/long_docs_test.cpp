// Long documents in the simulator: pieces of one document span ranks as cad.pack_documents lays them, cut
// only at group edges; every balancer computes the same attention; colocated over pieces gathers K/V; the
// memory per server holds the longest document's K/V; bad groups are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "calibration_fixture.h"
#include "long_docs.h"
#include "plan_work.h"
#include "simulation.h"

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

sim::Scenario long_scenario(int64_t ranks, int64_t group) {
  sim::Scenario s;
  s.shape = sim::model_preset("llama-8b");
  s.shape.layers = 2;
  s.layout = sim::Layout{ranks, 4, 1, 1};
  for (int i = 0; i < 200; ++i) s.lengths.push_back(500 + (i * 7919) % 9000);
  for (int i = 0; i < 20; ++i) s.lengths.push_back(65536);
  s.context = 8192;       // tokens per rank
  s.max_doc_len = 32768;  // documents up to 4 ranks long
  s.document_group = group;
  for (const char* n : {"colocated", "per_doc_cp", "distca", "prefix_aware"}) {
    sim::BalancerSpec b;
    b.name = n;
    b.group_size = std::string(n) == "distca" || std::string(n) == "prefix_aware" ? 0 : group;
    b.plan_is_layout = std::string(n) == "per_doc_cp";
    s.balancers.push_back(b);
  }
  // prefix_aware again, in per_doc_cp's groups: the same ranks, for the bytes.
  sim::BalancerSpec same = s.balancers.back();
  same.group_size = group;
  s.balancers.push_back(same);
  s.search_path = CAD_BALANCER_PLUGIN_DIR;
  s.seed = 5;
  s.detail = true;
  return s;
}

}  // namespace

TEST(SimulateLongDocs, DocumentsKeepTheirPiecesInsideAGroup) {
  // Document 0 spans ranks 0-2, document 1 ranks 2-3 (the group edge after rank 1 cuts document 0).
  const cad::plan::RankPieces batch = {{piece(0, 25, 0, 10)},
                                       {piece(0, 25, 10, 10)},
                                       {piece(0, 25, 20, 5), piece(1, 15, 0, 5)},
                                       {piece(1, 15, 5, 10)}};
  int64_t cut = -1;
  const cad::plan::RankPieces whole = sim::documents_within_groups(batch, 4, &cut);
  EXPECT_EQ(cut, 0);
  EXPECT_EQ(whole[2][0].doc_id, whole[0][0].doc_id);
  EXPECT_EQ(whole[2][0].offset_in_doc, 20);
  EXPECT_EQ(whole[2][0].doc_len, 25);
  EXPECT_EQ(whole[3][0].doc_id, whole[2][1].doc_id);

  const cad::plan::RankPieces halves = sim::documents_within_groups(batch, 2, &cut);
  EXPECT_EQ(cut, 1);  // document 0 crosses the edge after rank 1
  EXPECT_EQ(halves[0][0].doc_id, halves[1][0].doc_id);
  EXPECT_EQ(halves[0][0].doc_len, 20);
  EXPECT_NE(halves[2][0].doc_id, halves[0][0].doc_id);  // its last 5 tokens: a document of their own
  EXPECT_EQ(halves[2][0].offset_in_doc, 0);
  EXPECT_EQ(halves[2][0].doc_len, 5);
  EXPECT_EQ(halves[3][0].offset_in_doc, 5);  // document 1 lies whole in the second group
  EXPECT_EQ(halves[3][0].doc_len, 15);
  EXPECT_THROW(sim::documents_within_groups(batch, 3, nullptr), std::invalid_argument);
}

TEST(SimulateLongDocs, BalancersShareTheAttentionAndColocatedGathersKv) {
  const sim::Scenario s = long_scenario(8, 4);
  // The batch: the long-document layout, documents spanning ranks.
  int64_t cut = 0;
  const cad::plan::RankPieces batch = sim::scenario_batch(s, 8, s.seed, &cut);
  const cad::workload::LayoutSummary layout = cad::workload::summarize(batch);
  EXPECT_GE(layout.widest_span, 3);
  EXPECT_GT(layout.longest, s.context);

  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}});
  sim::BatchSummary summary;
  const std::vector<sim::BalancerResult> r = sim::simulate(s, cal, *rates, &summary);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(summary.widest_span, layout.widest_span);
  EXPECT_EQ(summary.longest, layout.longest);
  // Every balancer computes the same attention FLOPs (constant rates: seconds are FLOPs), only elsewhere.
  auto total_fwd = [](const sim::BalancerResult& b) {
    double t = 0;
    for (const auto& rank : b.detail.at(0).ranks) t += rank.attention_fwd_s;
    return t;
  };
  for (const auto& b : r) EXPECT_NEAR(total_fwd(b), total_fwd(r[0]), 1e-9 * total_fwd(r[0])) << b.name;
  // colocated over pieces is the all-gather-KV CP: it moves K/V and holds the longest document's K/V.
  EXPECT_EQ(r[0].group_size, 4);
  EXPECT_GT(r[0].bytes_per_layer, 0);
  EXPECT_GE(r[0].max_kv_rows, layout.longest);
  EXPECT_GT(r[0].attention_imbalance, 1.3);
  // prefix_aware balances over all 8 ranks; over per_doc_cp's groups of 4 it moves fewer bytes than
  // per_doc_cp (over all 8 it moves more here: it also evens the groups out, which per_doc_cp cannot).
  EXPECT_LT(r[3].attention_imbalance, 1.06);
  EXPECT_LT(r[4].bytes_per_layer, r[1].bytes_per_layer);
  EXPECT_LT(r[3].off.mean_step_seconds, r[0].off.mean_step_seconds);
  for (const auto& b : r) {
    EXPECT_GT(b.max_kv_bytes, 0) << b.name;
    const auto& ranks = b.detail.at(0).ranks;
    const int64_t most = std::max_element(ranks.begin(), ranks.end(), [](const auto& x, const auto& y) {
                           return x.kv_bytes < y.kv_bytes;
                         })->kv_bytes;
    EXPECT_LE(most, b.max_kv_bytes) << b.name;
  }
}

TEST(SimulateLongDocs, RefusesGroupsThatWouldCutDocuments) {
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}});
  auto message = [&](const sim::Scenario& s) {
    try {
      sim::simulate(s, cal, *rates);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  sim::Scenario s = long_scenario(8, 2);
  EXPECT_NE(message(s).find("--max-doc-len 32768 is more than a group of --cp-size 2 ranks x --tokens-per-rank 8192 "
                            "holds; raise --cp-size to at least 4"),
            std::string::npos);
  s = long_scenario(8, 3);
  EXPECT_NE(message(s).find("the document group (--cp-size 3) must divide the 8 data-parallel ranks"), std::string::npos);
  s = long_scenario(8, 4);
  s.balancers[2].group_size = 2;
  EXPECT_NE(message(s).find("balancer 'distca' plans groups of 2 ranks, not a multiple of the document group"),
            std::string::npos);
}
