// The pipeline trainer's 1F1B model (--schedule 1f1b_ticks; host_adapter/simulate/pipeline_model.h,
// one_f_one_b_simulation.h): the timetable as train_pipeline.py's one_f_one_b makes it, a mixed tick (one stage
// forward, the other backward) priced by hand under tick pooling and locally, and the driver with the real
// balancer plugins and its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "batch_recipe.h"
#include "pipeline_fixture.h"
#include "pipeline_model.h"
#include "plan_work.h"
#include "simulation.h"

namespace sim = cad::simulate;

namespace {

// "F2", "B0", "-": one stage's operation as the trainer's docstring writes it.
std::string name(const sim::StageOp& op) {
  if (op.micro_batch < 0) return "-";
  return (op.backward ? "B" : "F") + std::to_string(op.micro_batch);
}

sim::RankWork work(int64_t tokens, double fwd, double bwd) {
  sim::RankWork w;
  w.tokens = tokens;
  w.attention.fwd = fwd;
  w.attention.bwd = bwd;
  return w;
}

sim::Scenario one_f_one_b(int64_t pp, int64_t dp, const std::vector<std::string>& balancers, sim::PipelinePool pool,
                          const sim::TrainerCalibration* tcal) {
  return sim::testing::pipeline(pp, dp, balancers, pool, tcal, sim::Schedule::k1f1bTicks);
}

}  // namespace

TEST(OneFOneBSchedule, TwoStagesFourMicroBatchesAsTheTrainer) {
  // examples/train_pipeline.py one_f_one_b(4, 2).
  const std::vector<std::vector<std::string>> expected = {{"F0", "-"},  {"F1", "F0"}, {"-", "B0"},  {"B0", "F1"},
                                                          {"F2", "B1"}, {"B1", "F2"}, {"F3", "B2"}, {"B2", "F3"},
                                                          {"-", "B3"},  {"B3", "-"}};
  const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(2, 4);
  ASSERT_EQ(table.size(), expected.size());
  for (size_t t = 0; t < table.size(); ++t) {
    ASSERT_EQ(table[t].size(), 2u);
    for (size_t s = 0; s < 2; ++s) EXPECT_EQ(name(table[t][s]), expected[t][s]) << "tick " << t << " stage " << s;
  }
  EXPECT_THROW(sim::one_f_one_b_schedule(0, 4), std::invalid_argument);
  EXPECT_THROW(sim::one_f_one_b_schedule(2, 0), std::invalid_argument);
}

TEST(OneFOneBSchedule, EveryOperationOnceAfterWhatItNeeds) {
  for (int64_t pp : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 3, 5, 16}) {
      const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(pp, m);
      // As many ticks as GPipe: 2 (M + PP - 1).
      EXPECT_EQ(static_cast<int64_t>(table.size()), 2 * (m + pp - 1)) << "pp " << pp << " m " << m;
      // at[backward][stage][micro-batch]: the tick it ran at.
      using Ticks = std::vector<std::vector<int64_t>>;  // [stage][micro-batch]
      std::vector<Ticks> at(2, Ticks(static_cast<size_t>(pp), std::vector<int64_t>(static_cast<size_t>(m), -1)));
      for (size_t t = 0; t < table.size(); ++t) {
        for (int64_t s = 0; s < pp; ++s) {
          const sim::StageOp& op = table[t][static_cast<size_t>(s)];
          if (op.micro_batch < 0) continue;
          ASSERT_LT(op.micro_batch, m);
          int64_t& tick = at[op.backward ? 1 : 0][static_cast<size_t>(s)][static_cast<size_t>(op.micro_batch)];
          EXPECT_EQ(tick, -1) << "stage " << s << " runs " << name(op) << " twice";
          tick = static_cast<int64_t>(t);
        }
      }
      for (int64_t s = 0; s < pp; ++s) {
        const auto& fwd = at[0][static_cast<size_t>(s)];
        const auto& bwd = at[1][static_cast<size_t>(s)];
        for (int64_t j = 0; j < m; ++j) {
          const size_t i = static_cast<size_t>(j);
          ASSERT_GE(fwd[i], 0) << "stage " << s << " never runs F" << j;
          ASSERT_GE(bwd[i], 0) << "stage " << s << " never runs B" << j;
          // What it needs ran at an earlier tick (outputs travel at a tick's end).
          if (s > 0) {
            EXPECT_LT(at[0][static_cast<size_t>(s - 1)][i], fwd[i]);
          }
          if (s < pp - 1) {
            EXPECT_LT(at[1][static_cast<size_t>(s + 1)][i], bwd[i]);
          }
          EXPECT_LT(fwd[i], bwd[i]);
        }
        // In flight (forward run, backward not yet) after each tick: at most min(S - s, M) (GPipe: M).
        for (size_t t = 0; t < table.size(); ++t) {
          int64_t in_flight = 0;
          for (int64_t j = 0; j < m; ++j) {
            const size_t i = static_cast<size_t>(j);
            in_flight += fwd[i] <= static_cast<int64_t>(t) && bwd[i] > static_cast<int64_t>(t) ? 1 : 0;
          }
          EXPECT_LE(in_flight, std::min(pp - s, m)) << "pp " << pp << " m " << m << " stage " << s << " tick " << t;
        }
      }
    }
  }
}

TEST(OneFOneBTick, MixedTickByHand) {
  // PP = 2, DP = 1, 2 layers per stage, full checkpointing, kernel scale 1; call 1 ms, exchange fixed 0.1 ms (no
  // bytes: its curve part is 0). Stage 0 runs the forward of micro-batch 1 (1000 tokens), stage 1, the last, the
  // backward of micro-batch 0 (2000 tokens).
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const sim::SystemCalibration cal = sim::testing::pipeline_system();
  const sim::TrainerOptions options;
  const std::vector<sim::StageOp> ops = {{false, 1}, {true, 0}};
  // Tick pooling: plan (m, s) at m x 2 + s over both ranks, only stage s's rank holding documents.
  std::vector<std::vector<sim::RankWork>> pooled(4, std::vector<sim::RankWork>(2));
  pooled[1 * 2 + 0] = {work(1000, 0.010, 0.020), work(0, 0.006, 0.012)};  // F1 on stage 0
  pooled[0 * 2 + 1] = {work(0, 0.003, 0.008), work(2000, 0.005, 0.010)};  // B0 on stage 1
  const sim::PricedTick tick = sim::one_f_one_b_tick(ops, pooled, 1, 2, sim::PipelinePool::kTick, cal, tcal, options);
  ASSERT_EQ(tick.ranks.size(), 2u);
  // Own operations: stage 0 1 unit of 4 of 1000 x 4 us; stage 1 3 units of 2000 x 4 us and 3/4 of the head.
  EXPECT_NEAR(tick.ranks[0].non_attention, 0.001, 1e-12);
  EXPECT_NEAR(tick.ranks[1].non_attention, 0.006, 1e-12);
  EXPECT_DOUBLE_EQ(tick.ranks[0].head, 0);
  EXPECT_NEAR(tick.ranks[1].head, 2000 * 9e-6 * 3 / 4, 1e-12);
  // Every rank makes all three calls of a layer: F1/s0's forward, B0/s1's recomputed forward, B0/s1's backward.
  EXPECT_NEAR(tick.ranks[0].attention, (0.010 + 0.001) + (0.003 + 0.001) + (0.008 + 0.001), 1e-12);
  EXPECT_NEAR(tick.ranks[1].attention, (0.006 + 0.001) + (0.005 + 0.001) + (0.010 + 0.001), 1e-12);
  EXPECT_NEAR(tick.ranks[0].exchange, 3 * 100e-6, 1e-12);
  EXPECT_NEAR(tick.ranks[0].kernel, 0.010 + 0.003 + 0.008, 1e-12);
  // Lockstep per call: per layer the slowest non-attention (0.006), then each call's slowest server with its
  // exchange: max(0.0111, 0.0071) + max(0.0041, 0.0061) + max(0.0091, 0.0111); + the head once.
  const double calls = 0.0111 + 0.0061 + 0.0111;
  const double head = 2000 * 9e-6 * 3 / 4;
  EXPECT_NEAR(tick.critical.total, 2 * (0.006 + calls) + head, 1e-12);
  EXPECT_NEAR(tick.critical.linear, 2 * 0.006 + head, 1e-12);
  EXPECT_NEAR(tick.critical.attention, 2 * (0.011 + 0.006 + 0.011), 1e-12);
  EXPECT_NEAR(tick.critical.comm, 2 * 3 * 100e-6, 1e-12);
  // Summing each call's maximum is slower than GPipe's one maximum per rank over all of them.
  EXPECT_GT(tick.critical.total, sim::tick_seconds(tick.ranks, 2, sim::PipelinePool::kTick));

  // The same plans, each rank making only its own operation's calls: locally (no exchange) the slowest rank
  // alone, 2 x (0.006 + (0.005 + 0.001) + (0.010 + 0.001)) + head; per stage with the exchange of its 2 calls.
  const sim::PricedTick local = sim::one_f_one_b_tick(ops, pooled, 1, 2, sim::PipelinePool::kLocal, cal, tcal, options);
  EXPECT_NEAR(local.ranks[0].attention, 0.011, 1e-12);
  EXPECT_DOUBLE_EQ(local.ranks[0].exchange, 0);
  EXPECT_NEAR(local.critical.total, 2 * (0.006 + 0.017) + head, 1e-12);
  EXPECT_NEAR(local.critical.attention, 2 * 0.017, 1e-12);
  const sim::PricedTick stage = sim::one_f_one_b_tick(ops, pooled, 1, 2, sim::PipelinePool::kStage, cal, tcal, options);
  EXPECT_NEAR(stage.critical.total, 2 * (0.006 + 0.017 + 2 * 100e-6) + head, 1e-12);

  // Without checkpointing a backward makes one call (no recomputed forward) and 2 units of non-attention.
  sim::TrainerOptions none;
  none.checkpointing = false;
  const sim::PricedTick plain = sim::one_f_one_b_tick(ops, pooled, 1, 2, sim::PipelinePool::kTick, cal, tcal, none);
  EXPECT_NEAR(plain.ranks[1].non_attention, 0.004, 1e-12);
  EXPECT_NEAR(plain.critical.total, 2 * (0.004 + 0.0111 + 0.0111) + head, 1e-12);

  // An idle stage: under tick pooling it serves the others' calls; locally it does nothing.
  const std::vector<sim::StageOp> drain = {{false, -1}, {true, 0}};
  const sim::PricedTick serving =
      sim::one_f_one_b_tick(drain, pooled, 1, 2, sim::PipelinePool::kTick, cal, tcal, options);
  EXPECT_DOUBLE_EQ(serving.ranks[0].non_attention, 0);
  EXPECT_NEAR(serving.ranks[0].attention, (0.003 + 0.001) + (0.008 + 0.001), 1e-12);
  const sim::PricedTick idle =
      sim::one_f_one_b_tick(drain, pooled, 1, 2, sim::PipelinePool::kLocal, cal, tcal, options);
  EXPECT_DOUBLE_EQ(idle.ranks[0].total + idle.ranks[0].head, 0);
  // A plan of the wrong size is refused, not read past.
  std::vector<std::vector<sim::RankWork>> short_plans = pooled;
  short_plans[1].resize(1);
  EXPECT_THROW(sim::one_f_one_b_tick(ops, short_plans, 1, 2, sim::PipelinePool::kTick, cal, tcal, options),
               std::invalid_argument);
}

TEST(OneFOneBRun, StagePoolWithOneReplicaPricesLikeColocated) {
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::Scenario s = one_f_one_b(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kStage, &tcal);
  const std::vector<sim::BalancerResult> r = sim::simulate(s, sim::testing::pipeline_system(), *rates);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].group_size, 1);
  EXPECT_NEAR(r[1].off.mean_step_seconds, r[0].off.mean_step_seconds, 1e-9 * r[0].off.mean_step_seconds);
  EXPECT_DOUBLE_EQ(r[1].bytes_per_layer, 0);
  // The step is the sum of its 10 ticks plus the fixed part; the ticks are the timetable's.
  const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(2, 4);
  ASSERT_EQ(r[0].ticks.size(), table.size());
  double sum = tcal.step_fixed_ms * 1e-3;
  for (size_t t = 0; t < table.size(); ++t) {
    const sim::TickDetail& d = r[0].ticks[t];
    sum += d.seconds;
    EXPECT_EQ(d.tick.index, static_cast<int64_t>(t));
    ASSERT_EQ(d.ops.size(), 2u);
    for (size_t st = 0; st < 2; ++st) {
      EXPECT_EQ(name(d.ops[st]), name(table[t][st]));
      EXPECT_EQ(d.tick.micro_batch[st], table[t][st].micro_batch);
    }
  }
  EXPECT_NEAR(r[0].off.mean_step_seconds, sum, 1e-12);
  EXPECT_DOUBLE_EQ(r[0].on.mean_step_seconds, r[0].off.mean_step_seconds);
}

TEST(OneFOneBRun, LocalRanksDoTheSameWorkAsUnderGpipe) {
  // Colocated over 2 stages x 2 replicas: every rank runs the same operations on the same tokens in both
  // timetables, only at other ticks, so its own parts (the mean over ranks) are GPipe's; the step differs.
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::pipeline_system();
  const auto a = sim::simulate(one_f_one_b(2, 2, {"colocated"}, sim::PipelinePool::kStage, &tcal), cal, *rates);
  const auto g =
      sim::simulate(sim::testing::pipeline(2, 2, {"colocated"}, sim::PipelinePool::kStage, &tcal), cal, *rates);
  EXPECT_NEAR(a[0].off.mean.linear, g[0].off.mean.linear, 1e-12);
  EXPECT_NEAR(a[0].off.mean.attention, g[0].off.mean.attention, 1e-12);
  EXPECT_NEAR(a[0].off.mean.total, g[0].off.mean.total, 1e-12);
  // Each replica a pipeline of its own: the step is the slowest replica's sum of ticks.
  double replica[2] = {0, 0};
  for (const auto& t : a[0].ticks) {
    ASSERT_EQ(t.ranks.size(), 4u);
    for (int rep = 0; rep < 2; ++rep) {
      replica[rep] += sim::tick_seconds({t.ranks[static_cast<size_t>(rep)], t.ranks[static_cast<size_t>(2 + rep)]}, 2,
                                        sim::PipelinePool::kLocal);
    }
  }
  EXPECT_NEAR(a[0].off.mean_step_seconds, std::max(replica[0], replica[1]) + tcal.step_fixed_ms * 1e-3, 1e-12);
}

TEST(OneFOneBRun, TickPoolPlansEachMicroBatchAndStageOverEveryRank) {
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::Scenario s = one_f_one_b(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kTick, &tcal);
  const std::vector<sim::BalancerResult> r = sim::simulate(s, sim::testing::pipeline_system(), *rates);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].group_size, 2);
  std::vector<int64_t> docs;
  for (uint64_t seed : s.batch_seeds) {
    const cad::plan::RankPieces b = sim::documents_per_rank(cad::workload::sample_batch(s.lengths, s.context, 1, seed));
    docs.push_back(static_cast<int64_t>(b[0].size()));
  }
  ASSERT_EQ(r[1].ticks.size(), 10u);
  for (const sim::TickDetail& t : r[1].ticks) {
    // The tick's plans are its operations' own: each (micro-batch, stage)'s documents.
    int64_t expected = 0, calls = 0;
    for (const sim::StageOp& op : t.ops) {
      if (op.micro_batch < 0) continue;
      expected += docs[static_cast<size_t>(op.micro_batch)];
      calls += op.backward ? 2 : 1;
    }
    EXPECT_EQ(t.plan_documents, expected) << "tick " << t.tick.index;
    ASSERT_EQ(t.ranks.size(), 2u);
    for (size_t st = 0; st < 2; ++st) {
      EXPECT_EQ(t.ranks[st].tokens, t.ops[st].micro_batch >= 0 ? s.context : 0);
      // Every rank makes every call of the tick, idle ones too, and serves kernels in them.
      EXPECT_GT(t.ranks[st].attention, static_cast<double>(calls) * tcal.attention_call_us * 1e-6 + 1e-4)
          << "tick " << t.tick.index << " stage " << st;
      // One exchange per call: at least its fixed part each.
      EXPECT_GE(t.ranks[st].exchange, static_cast<double>(calls) * 100e-6 - 1e-15)
          << "tick " << t.tick.index << " stage " << st;
    }
  }
  // Colocated: an idle stage does nothing.
  EXPECT_EQ(name(r[0].ticks[0].ops[1]), "-");
  EXPECT_DOUBLE_EQ(r[0].ticks[0].ranks[1].total, 0);
  EXPECT_LT(r[1].attention_imbalance, r[0].attention_imbalance);
  EXPECT_GT(r[1].bytes_per_layer, 0);
}

TEST(OneFOneBRun, RefusalsNameTheSchedule) {
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const sim::Scenario s = one_f_one_b(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kTick, &tcal);
  using sim::testing::refusal;
  sim::Scenario one_stage = s;
  one_stage.layout = sim::Layout{1, 1, 1, 1};
  EXPECT_NE(refusal(one_stage).find("--schedule 1f1b_ticks needs --pp >= 2"), std::string::npos) << refusal(one_stage);
  sim::Scenario no_trainer = s;
  no_trainer.trainer = nullptr;
  EXPECT_NE(refusal(no_trainer).find("--schedule 1f1b_ticks prices the pipeline trainer's ticks"), std::string::npos)
      << refusal(no_trainer);
  sim::Scenario cp = s;
  cp.balancers[1].name = "per_doc_cp";
  cp.balancers[1].plan_is_layout = true;
  EXPECT_NE(refusal(cp).find("--schedule 1f1b_ticks: balancer 'per_doc_cp' (its plan is the token layout)"),
            std::string::npos)
      << refusal(cp);
  sim::Scenario local_pool = s;
  local_pool.pool = sim::PipelinePool::kLocal;
  EXPECT_NE(refusal(local_pool).find("--pool: expected tick or stage"), std::string::npos) << refusal(local_pool);
}
