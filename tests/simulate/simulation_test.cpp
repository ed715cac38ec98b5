// The driver end to end with the real balancer plugins: colocated's step equals the hand formula,
// balancing helps, ping-pong never hurts, groups behave, and bad scenarios are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "batch_recipe.h"
#include "calibration_fixture.h"
#include "plan_work.h"
#include "simulation.h"

namespace sim = cad::simulate;

namespace {

sim::SystemCalibration calibration() { return sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}}); }

sim::Scenario scenario(int64_t gpus) {
  sim::Scenario s;
  s.shape = sim::model_preset("llama-8b");
  s.layout = sim::Layout{gpus, 4, 1, 1};
  // Lengths in the shape of the Pretrain mix (many short documents, a few at the 64K cut).
  for (int i = 0; i < 400; ++i) s.lengths.push_back(500 + (i * 7919) % 9000);
  for (int i = 0; i < 12; ++i) s.lengths.push_back(65536 + i * 1000);
  s.context = 65536;
  for (const char* n : {"colocated", "per_doc_cp", "distca", "prefix_aware"}) {
    sim::BalancerSpec b;
    b.name = n;
    b.group_size = std::string(n) == "colocated" ? 1 : std::string(n) == "per_doc_cp" ? 4 : 0;
    b.plan_is_layout = std::string(n) == "per_doc_cp";
    s.balancers.push_back(b);
  }
  s.search_path = CAD_BALANCER_PLUGIN_DIR;
  s.seed = 3;
  return s;
}

}  // namespace

TEST(SimulateRun, ColocatedMatchesTheHandFormula) {
  const sim::Scenario s = scenario(8);
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = calibration();
  const std::vector<sim::BalancerResult> r = sim::simulate(s, cal, *rates);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].name, "colocated");

  // By hand: every rank runs its own pieces as whole documents (a document cut by a rank's edge is
  // two, for every balancer), linear work is the same on all ranks, so the step is linear + the busiest rank's attention.
  const cad::plan::RankPieces batch = cad::workload::sample_batch(s.lengths, s.context, 8, s.seed);
  double max_entries = 0, sum_entries = 0;
  for (const auto& rank : batch) {
    double e = 0;
    for (const auto& p : rank) e += static_cast<double>(p.len) * static_cast<double>(p.len + 1) / 2;
    max_entries = std::max(max_entries, e);
    sum_entries += e;
  }
  const double flops_per_entry = 4.0 * 128 * 32;
  const double attention = 32 * max_entries * flops_per_entry * (1 / 600e12 + 2.5 / 400e12);
  const double tokens = static_cast<double>(s.context);
  const double linear = 32 * 3 * (tokens * s.shape.linear_flops_per_token_layer() / 500e12 + tokens * 4096 * 48 / 4000e9) +
                        3 * tokens * s.shape.head_flops_per_token() / 500e12;
  EXPECT_NEAR(r[0].off.mean_step_seconds, linear + attention, 1e-9 * (linear + attention));
  EXPECT_NEAR(r[0].attention_imbalance, max_entries * 8 / sum_entries, 1e-9);
  EXPECT_DOUBLE_EQ(r[0].bytes_per_layer, 0);
  EXPECT_DOUBLE_EQ(r[0].on.mean_step_seconds, r[0].off.mean_step_seconds);  // nothing to hide

  for (const auto& b : r) {
    EXPECT_LE(b.on.mean_step_seconds, b.off.mean_step_seconds + 1e-12) << b.name;
    EXPECT_GE(b.attention_imbalance, 1.0) << b.name;
  }
  // The batch is imbalanced; whole-world balancers fix it and win, and prefix_aware moves fewer bytes.
  EXPECT_GT(r[0].attention_imbalance, 1.5);
  EXPECT_LT(r[3].attention_imbalance, 1.06);
  EXPECT_LT(r[3].on.mean_step_seconds, r[0].on.mean_step_seconds);
  EXPECT_LT(r[3].bytes_per_layer, r[2].bytes_per_layer);
  // per_doc_cp balances inside its groups of 4 only.
  EXPECT_EQ(r[1].group_size, 4);
  EXPECT_GT(r[1].bytes_per_layer, r[3].bytes_per_layer);
  // Every balancer computes the same attention, only elsewhere: the mean rank's attention is equal.
  for (const auto& b : r) EXPECT_NEAR(b.off.mean.attention, r[0].off.mean.attention, 1e-6 * r[0].off.mean.attention) << b.name;
}

TEST(SimulateRun, StepsMicrobatchesAndPipeline) {
  sim::Scenario s = scenario(8);
  s.balancers.resize(1);  // colocated
  s.steps = 2;
  s.microbatches = 3;
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = calibration();
  const auto flat = sim::simulate(s, cal, *rates);
  ASSERT_EQ(flat[0].off.step_seconds.size(), 2u);
  s.layout.pp = 2;
  s.layout.gpus = 16;  // same 8 data-parallel ranks, 2 stages
  const auto piped = sim::simulate(s, cal, *rates);
  // Half the layers per stage, plus one slowest micro-batch of fill/drain: between half and the whole.
  EXPECT_LT(piped[0].off.mean_step_seconds, flat[0].off.mean_step_seconds);
  EXPECT_GT(piped[0].off.mean_step_seconds, 0.5 * flat[0].off.mean_step_seconds);
}

TEST(SimulateRun, RefusesBadScenarios) {
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = calibration();
  auto message = [&](const sim::Scenario& s) {
    try {
      sim::simulate(s, cal, *rates);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  sim::Scenario s = scenario(8);
  s.layout.tp = 3;
  EXPECT_NE(message(s).find("--gpus 8 is not a multiple of --tp x --pp = 3"), std::string::npos);
  s = scenario(8);
  s.context = 0;
  EXPECT_NE(message(s).find("--context must be >= 1"), std::string::npos);
  s = scenario(8);
  s.balancers[0].name = "no_such_balancer";
  EXPECT_NE(message(s).find("no_such_balancer"), std::string::npos);
  s = scenario(8);
  s.shape.head_dim = 64;
  const auto table = sim::load_attention_rates(CAD_CALIBRATION_DIR "/h200.json");
  try {
    sim::simulate(s, cal, *table);
    ADD_FAILURE() << "head_dim 64 against a D=128 table was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("holds for head_dim 128, the model has head_dim 64"), std::string::npos);
  }
}
