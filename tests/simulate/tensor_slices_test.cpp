// Tensor parallelism as it runs: each TP index's head slice, the same plan on every index, and bytes per
// GPU that fall as 1/tp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "balancer_runner.h"
#include "batch_recipe.h"
#include "calibration_fixture.h"
#include "plan_work.h"
#include "simulation.h"
#include "tensor_slices.h"

namespace sim = cad::simulate;

TEST(SimulateTensorSlices, SlicesPartitionTheHeads) {
  const sim::ModelShape shape = sim::model_preset("llama-8b");  // 32 query heads, 8 KV heads
  for (const int64_t tp : {1, 2, 4, 8}) {
    const sim::Layout layout{8 * tp, 8 * tp, tp, 1};
    std::vector<int> q(32, 0), kv(8, 0);
    for (int64_t i = 0; i < tp; ++i) {
      const sim::HeadSlice h = sim::head_slice(layout, shape, i);
      EXPECT_EQ(h.q_heads, 32 / tp);
      EXPECT_EQ(h.kv_heads, 8 / tp);
      EXPECT_FALSE(h.kv_replicated);
      for (int64_t k = 0; k < h.q_heads; ++k) ++q[static_cast<size_t>(h.q_head_begin + k)];
      for (int64_t k = 0; k < h.kv_heads; ++k) ++kv[static_cast<size_t>(h.kv_head_begin + k)];
    }
    for (const int c : q) EXPECT_EQ(c, 1) << "tp " << tp;
    for (const int c : kv) EXPECT_EQ(c, 1) << "tp " << tp;
  }
  // TP 16 > 8 KV heads: one KV head per GPU, each held by two consecutive indices (Megatron's replication).
  const sim::Layout wide{16, 16, 16, 1};
  EXPECT_TRUE(sim::head_slice(wide, shape, 3).kv_replicated);
  EXPECT_EQ(sim::head_slice(wide, shape, 3).kv_heads, 1);
  EXPECT_EQ(sim::head_slice(wide, shape, 2).kv_head_begin, 1);
  EXPECT_EQ(sim::head_slice(wide, shape, 3).kv_head_begin, 1);
  EXPECT_EQ(sim::head_slice(wide, shape, 15).q_head_begin, 30);
  EXPECT_THROW(sim::head_slice(wide, shape, 16), std::invalid_argument);
}

TEST(SimulateTensorSlices, EveryTpIndexMakesTheSamePlan) {
  const sim::ModelShape shape = sim::model_preset("llama-8b");
  const sim::Layout layout{32, 32, 8, 1};  // 4 data-parallel ranks x TP 8
  std::vector<int64_t> lengths;
  for (int i = 0; i < 200; ++i) lengths.push_back(300 + (i * 7919) % 6000);
  for (int i = 0; i < 4; ++i) lengths.push_back(65536);
  const cad::plan::RankPieces batch = sim::documents_per_rank(cad::workload::sample_batch(lengths, 16384, 4, 2));
  for (const char* name : {"prefix_aware", "distca"}) {
    sim::BalancerRunner runner(name, "{}", CAD_BALANCER_PLUGIN_DIR);
    const std::vector<cad_task_v1_t> first = runner.plan(batch, sim::slice_cost(layout, shape, 0, 128));
    ASSERT_FALSE(first.empty());
    for (int64_t i = 1; i < layout.tp; ++i) {
      const cad_cost_params_v1_t cost = sim::slice_cost(layout, shape, i, 128);
      EXPECT_TRUE(sim::same_cost(cost, sim::slice_cost(layout, shape, 0, 128)));
      const std::vector<cad_task_v1_t> tasks = runner.plan(batch, cost);
      ASSERT_EQ(tasks.size(), first.size()) << name << " TP index " << i;
      for (size_t k = 0; k < tasks.size(); ++k) {
        EXPECT_EQ(tasks[k].doc_id, first[k].doc_id);
        EXPECT_EQ(tasks[k].q_begin, first[k].q_begin);
        EXPECT_EQ(tasks[k].q_end, first[k].q_end);
        EXPECT_EQ(tasks[k].server, first[k].server);
      }
    }
  }
}

TEST(SimulateTensorSlices, BytesPerGpuFallAsOneOverTp) {
  sim::Scenario s;
  s.shape = sim::model_preset("llama-8b");
  for (int i = 0; i < 300; ++i) s.lengths.push_back(500 + (i * 7919) % 9000);
  for (int i = 0; i < 8; ++i) s.lengths.push_back(65536);
  s.context = 32768;
  for (const char* n : {"per_doc_cp", "distca", "prefix_aware"}) {
    sim::BalancerSpec b;
    b.name = n;
    b.plan_is_layout = std::string(n) == "per_doc_cp";
    s.balancers.push_back(b);
  }
  s.search_path = CAD_BALANCER_PLUGIN_DIR;
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}});
  // 8 data-parallel ranks, one node's worth of each TP index per node: the same batches and nodes at every tp.
  std::vector<std::vector<sim::BalancerResult>> by_tp;
  for (const int64_t tp : {1, 2, 4, 8}) {
    s.layout = sim::Layout{8 * tp, 4 * tp, tp, 1};
    by_tp.push_back(sim::simulate(s, cal, *rates));
  }
  for (size_t b = 0; b < s.balancers.size(); ++b) {
    const double base = by_tp[0][b].bytes_per_layer;
    ASSERT_GT(base, 0) << s.balancers[b].name;
    for (size_t k = 1; k < by_tp.size(); ++k) {
      const double tp = static_cast<double>(int64_t{1} << k);
      EXPECT_NEAR(by_tp[k][b].bytes_per_layer * tp, base, 1e-9 * base) << s.balancers[b].name << " tp " << tp;
      EXPECT_NEAR(by_tp[k][b].bytes_inter_per_layer * tp, by_tp[0][b].bytes_inter_per_layer, 1e-9 * base);
      // The same plan at every tp: the same balance.
      EXPECT_NEAR(by_tp[k][b].attention_imbalance, by_tp[0][b].attention_imbalance, 1e-9);
    }
  }
}
