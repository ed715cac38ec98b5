// The pipeline trainer's 1F1B model (--schedule 1f1b_ticks; tools/simulate/pipeline_model.h,
// one_f_one_b_simulation.h): the timetable as train_pipeline.py's one_f_one_b makes it, a mixed tick (one stage
// forward, the other backward) priced by hand under tick pooling and locally, the clocks, --pool bubble (tick
// pooling only where some stage is idle), and the driver with the real balancer plugins and its refusals.
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

// A rank's own time in a tick as OneFOneBClocks reads it: per-layer total and the head.
sim::TickRankTime own(double per_layer, double head = 0) {
  sim::TickRankTime t;
  t.total = per_layer;
  t.head = head;
  return t;
}

// The trainer's rule for PP = 2 (exchange_1f1b), written out: the two stages send to each other at the end of a
// tick when stage 0 runs a forward or stage 1 a backward. Replays a priced step's ticks (2 stages x dp ranks) on
// per-rank clocks, each rank alone (local attention); returns every rank's end after each tick.
std::vector<std::vector<double>> two_stage_clocks(const std::vector<sim::TickDetail>& ticks, int64_t dp,
                                                  double layers) {
  std::vector<double> clock(static_cast<size_t>(2 * dp), 0.0);
  std::vector<std::vector<double>> out;
  for (const sim::TickDetail& t : ticks) {
    for (size_t r = 0; r < clock.size(); ++r) clock[r] += layers * t.ranks[r].total + t.ranks[r].head;
    const bool forward_on_0 = t.ops[0].micro_batch >= 0 && !t.ops[0].backward;
    const bool backward_on_1 = t.ops[1].micro_batch >= 0 && t.ops[1].backward;
    const bool meet = forward_on_0 || backward_on_1;
    if (meet) {
      for (int64_t r = 0; r < dp; ++r) {
        const double both = std::max(clock[static_cast<size_t>(r)], clock[static_cast<size_t>(dp + r)]);
        clock[static_cast<size_t>(r)] = clock[static_cast<size_t>(dp + r)] = both;
      }
    }
    out.push_back(clock);
  }
  return out;
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
  // (This is the tick's slowest rank, its `seconds` in the detail; the step is no longer the sum of these but
  // the ranks' clocks, OneFOneBClocks, since the stages meet only where they send to each other.)
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

TEST(OneFOneBClocks, StagesSendAtTheTrainersTicks) {
  // exchange_1f1b for M = 4, PP = 2 ([F0,-] [F1,F0] [-,B0] [B0,F1] [F2,B1] [B1,F2] [F3,B2] [B2,F3] [-,B3] [B3,-]):
  // a send when stage 0 runs a forward or stage 1 a backward; none in the mixed ticks (stage 0's backward has no
  // one to send to, stage 1's forward ends in the loss) nor in the last (stage 0's last backward).
  const std::vector<bool> expected = {true, true, true, false, true, false, true, false, true, false};
  const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(2, 4);
  ASSERT_EQ(table.size(), expected.size());
  for (size_t t = 0; t < table.size(); ++t) EXPECT_EQ(sim::stages_exchange(table[t], 0), expected[t]) << "tick " << t;
  EXPECT_THROW(sim::stages_exchange(table[0], 1), std::invalid_argument);  // the last stage has no stage after it
}

TEST(OneFOneBClocks, StagesMeetOnlyWhereTheySendByHand) {
  // PP = 2, DP = 1, 2 layers per stage; the first 5 ticks of the M = 4 timetable. Per layer a forward costs
  // 0.1 s, a backward 0.3 s; the last stage's head 0.3 s forward, 0.9 s backward.
  const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(2, 4);
  const sim::TickRankTime idle, fwd = own(0.1), bwd = own(0.3), last_fwd = own(0.1, 0.3), last_bwd = own(0.3, 0.9);
  const std::vector<std::vector<sim::TickRankTime>> ticks = {
      {fwd, idle}, {fwd, last_fwd}, {idle, last_bwd}, {bwd, last_fwd}, {fwd, last_bwd}};
  const std::vector<std::vector<double>> ends = {
      {0.2, 0.2},  // [F0,-]: stage 1 receives F0's activation, so it waits for stage 0 (0.2)
      {0.7, 0.7},  // [F1,F0]: 0.4 and 0.2 + 2 x 0.1 + 0.3 = 0.7; stage 0 sends F1's activation: both 0.7
      {2.2, 2.2},  // [-,B0]: 0.7 + 0.6 + 0.9; stage 1 sends B0's gradient
      {2.8, 2.7},  // [B0,F1]: nothing sent, so neither waits: 2.2 + 0.6 and 2.2 + 0.5
      {4.2, 4.2},  // [F2,B1]: 2.8 + 0.2 = 3.0 and 2.7 + 1.5 = 4.2, then they meet
  };
  sim::OneFOneBClocks clocks(sim::PipelinePool::kLocal, 2, 1, 2);
  double tick_maxima = 0;
  for (size_t t = 0; t < ticks.size(); ++t) {
    clocks.add(table[t], ticks[t]);
    ASSERT_EQ(clocks.ends().size(), 2u);
    EXPECT_NEAR(clocks.ends()[0], ends[t][0], 1e-12) << "tick " << t;
    EXPECT_NEAR(clocks.ends()[1], ends[t][1], 1e-12) << "tick " << t;
    tick_maxima += std::max(2 * ticks[t][0].total + ticks[t][0].head, 2 * ticks[t][1].total + ticks[t][1].head);
  }
  EXPECT_NEAR(clocks.seconds(), 4.2, 1e-12);
  // Summing the ticks' slowest ranks (the first version of the model) counts stage 0's backward of tick 3 and
  // stage 1's backward of tick 4 both in full: 0.2 + 0.5 + 1.5 + 0.6 + 1.5.
  EXPECT_NEAR(tick_maxima, 4.3, 1e-12);

  // Three stages: the middle one exchanges with both neighbours, each pair meets at the later of its own two
  // ends. [F,F,B] with own times 0.1, 0.2, 0.9 (1 layer): stage 0 waits only for stage 1 (0.2), not for
  // stage 1's transfer with stage 2 (0.9).
  sim::OneFOneBClocks three(sim::PipelinePool::kLocal, 3, 1, 1);
  three.add({{false, 2}, {false, 1}, {true, 0}}, {own(0.1), own(0.2), own(0.9)});
  EXPECT_NEAR(three.ends()[0], 0.2, 1e-12);
  EXPECT_NEAR(three.ends()[1], 0.9, 1e-12);
  EXPECT_NEAR(three.ends()[2], 0.9, 1e-12);

  // Tick pooling meets at every call: not these clocks. Wrong sizes are refused.
  EXPECT_THROW(sim::OneFOneBClocks(sim::PipelinePool::kTick, 2, 1, 2), std::invalid_argument);
  EXPECT_THROW(clocks.add(table[5], {fwd}), std::invalid_argument);
}

TEST(OneFOneBClocks, ReplicasAlonePerStageTogetherUnderStagePooling) {
  // PP = 2, DP = 2 (rank = stage x 2 + replica), 1 layer. [-,B]: stage 1's replicas take 0.3 and 0.5, and send
  // back to stage 0's. Then [F,-]: stage 0's take 0.4 and 0.1, and send on.
  const std::vector<sim::StageOp> drain = {{false, -1}, {true, 0}}, fill = {{false, 1}, {false, -1}};
  const sim::TickRankTime idle;
  const std::vector<sim::TickRankTime> first = {idle, idle, own(0.3), own(0.5)};
  const std::vector<sim::TickRankTime> second = {own(0.4), own(0.1), idle, idle};
  // Local: each replica a pipeline of its own. Replica 0: 0.3, then 0.3 + 0.4; replica 1: 0.5, then 0.6.
  sim::OneFOneBClocks local(sim::PipelinePool::kLocal, 2, 2, 1);
  local.add(drain, first);
  local.add(fill, second);
  const std::vector<double> local_ends = {0.7, 0.6, 0.7, 0.6};
  for (size_t r = 0; r < 4; ++r) EXPECT_NEAR(local.ends()[r], local_ends[r], 1e-12) << "rank " << r;
  EXPECT_NEAR(local.seconds(), 0.7, 1e-12);
  // Per stage: a stage's replicas meet at every call of their plan, so they start at the later clock and end with
  // the slower: 0.5, then 0.5 + 0.4 on every rank.
  sim::OneFOneBClocks stage(sim::PipelinePool::kStage, 2, 2, 1);
  stage.add(drain, first);
  stage.add(fill, second);
  for (size_t r = 0; r < 4; ++r) EXPECT_NEAR(stage.ends()[r], 0.9, 1e-12) << "rank " << r;
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
  // The ticks are the timetable's; the step is the last rank's end on the clocks (the stages meeting only where
  // they send to each other, as written out in two_stage_clocks) plus the fixed part, each tick's detail giving
  // the clocks after it.
  const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(2, 4);
  ASSERT_EQ(r[0].ticks.size(), table.size());
  double tick_sum = 0;
  for (size_t t = 0; t < table.size(); ++t) {
    const sim::TickDetail& d = r[0].ticks[t];
    tick_sum += d.seconds;
    EXPECT_EQ(d.tick.index, static_cast<int64_t>(t));
    ASSERT_EQ(d.ops.size(), 2u);
    for (size_t st = 0; st < 2; ++st) {
      EXPECT_EQ(name(d.ops[st]), name(table[t][st]));
      EXPECT_EQ(d.tick.micro_batch[st], table[t][st].micro_batch);
    }
  }
  const std::vector<std::vector<double>> ends = two_stage_clocks(r[0].ticks, 1, 2);
  for (size_t t = 0; t < table.size(); ++t) {
    ASSERT_EQ(r[0].ticks[t].rank_ends.size(), 2u);
    for (size_t k = 0; k < 2; ++k) EXPECT_NEAR(r[0].ticks[t].rank_ends[k], ends[t][k], 1e-12) << "tick " << t;
  }
  const double step = std::max(ends.back()[0], ends.back()[1]) + tcal.step_fixed_ms * 1e-3;
  EXPECT_NEAR(r[0].off.mean_step_seconds, step, 1e-12);
  // Stage 1's forwards overlap stage 0's backwards in the mixed ticks: shorter than the ticks' sum.
  EXPECT_LT(r[0].off.mean_step_seconds, tick_sum + tcal.step_fixed_ms * 1e-3 - 1e-6);
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
  // Each replica a pipeline of its own, its two stages meeting where they send to each other: the step is the
  // last rank's end, the replicas never waiting for each other.
  for (const auto& t : a[0].ticks) ASSERT_EQ(t.ranks.size(), 4u);
  const std::vector<std::vector<double>> ends = two_stage_clocks(a[0].ticks, 2, 2);
  const double last = *std::max_element(ends.back().begin(), ends.back().end());
  EXPECT_NEAR(a[0].off.mean_step_seconds, last + tcal.step_fixed_ms * 1e-3, 1e-12);
  EXPECT_NE(ends.back()[0], ends.back()[1]);  // the replicas' batches differ, and so do their ends
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
  // Under tick pooling every call meets every rank: the step is the sum of its ticks, no per-rank clocks.
  double sum = tcal.step_fixed_ms * 1e-3;
  for (const sim::TickDetail& t : r[1].ticks) {
    sum += t.seconds;
    EXPECT_TRUE(t.rank_ends.empty());
  }
  EXPECT_NEAR(r[1].off.mean_step_seconds, sum, 1e-12);
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
  EXPECT_NE(refusal(local_pool).find("--pool: expected tick, stage, bubble or bubble_stage"), std::string::npos)
      << refusal(local_pool);
  // --pool bubble needs full checkpointing (a forward and its backward can be pooled differently): refused
  // without it, priced with it.
  sim::Scenario bubble = s;
  bubble.pool = sim::PipelinePool::kBubble;
  bubble.trainer_options.checkpointing = false;
  EXPECT_NE(refusal(bubble).find("--pool bubble with --schedule 1f1b_ticks needs --checkpointing full"),
            std::string::npos)
      << refusal(bubble);
  bubble.trainer_options.checkpointing = true;
  EXPECT_EQ(refusal(bubble), "(not refused)");
}

TEST(OneFOneBBubble, BubbleTicksAreThoseWithAnIdleStage) {
  // M = 4, PP = 2: [F0,-] [F1,F0] [-,B0] [B0,F1] [F2,B1] [B1,F2] [F3,B2] [B2,F3] [-,B3] [B3,-].
  const std::vector<bool> two_by_four = {true, false, true, false, false, false, false, false, true, true};
  const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(2, 4);
  ASSERT_EQ(table.size(), two_by_four.size());
  for (size_t t = 0; t < table.size(); ++t) {
    EXPECT_EQ(sim::one_f_one_b_bubble_tick(table[t]), two_by_four[t]) << "tick " << t;
    EXPECT_EQ(sim::one_f_one_b_tick_pool(sim::PipelinePool::kBubble, table[t]),
              two_by_four[t] ? sim::PipelinePool::kTick : sim::PipelinePool::kLocal)
        << "tick " << t;
    // The other pools price every tick as they say.
    for (const sim::PipelinePool p : {sim::PipelinePool::kTick, sim::PipelinePool::kStage, sim::PipelinePool::kLocal}) {
      EXPECT_EQ(sim::one_f_one_b_tick_pool(p, table[t]), p) << "tick " << t;
    }
  }
  // M = 2 < PP = 3: [F0,-,-] [F1,F0,-] [-,F1,F0] [-,-,B0] [-,B0,F1] [B0,-,B1] [-,B1,-] [B1,-,-]: some stage
  // idle at every tick, so --pool bubble pools them all (it is --pool tick).
  const std::vector<std::vector<sim::StageOp>> short_table = sim::one_f_one_b_schedule(3, 2);
  ASSERT_EQ(short_table.size(), 8u);
  for (size_t t = 0; t < short_table.size(); ++t) {
    EXPECT_TRUE(sim::one_f_one_b_bubble_tick(short_table[t])) << "tick " << t;
  }
  // PP = 1: the one stage is never idle (the trainer's pipeline needs PP >= 2; this only pins the edge).
  for (const std::vector<sim::StageOp>& ops : sim::one_f_one_b_schedule(1, 3)) {
    EXPECT_FALSE(sim::one_f_one_b_bubble_tick(ops));
  }
  EXPECT_THROW(sim::one_f_one_b_bubble_tick({}), std::invalid_argument);
}

TEST(OneFOneBBubble, EveryRankMeetsAtABubbleTickByHand) {
  // PP = 2, DP = 1, 2 layers per stage, the M = 4 timetable; own times as in StagesMeetOnlyWhereTheySendByHand
  // (per layer a forward 0.1 s, a backward 0.3 s; the last stage's head 0.3 s forward, 0.9 s backward). The
  // bubble ticks 0, 2, 8, 9 are given pooled prices of 0.5, 1.7, 2.0 and 0.8 s.
  const std::vector<std::vector<sim::StageOp>> table = sim::one_f_one_b_schedule(2, 4);
  const sim::TickRankTime fwd = own(0.1), bwd = own(0.3), last_fwd = own(0.1, 0.3), last_bwd = own(0.3, 0.9);
  sim::OneFOneBClocks clocks(sim::PipelinePool::kBubble, 2, 1, 2);
  const auto expect_ends = [&](double stage0, double stage1, const char* what) {
    ASSERT_EQ(clocks.ends().size(), 2u);
    EXPECT_NEAR(clocks.ends()[0], stage0, 1e-12) << what;
    EXPECT_NEAR(clocks.ends()[1], stage1, 1e-12) << what;
  };
  clocks.add_pooled(0.5);  // [F0,-]: both start at 0, end at 0.5
  expect_ends(0.5, 0.5, "tick 0");
  clocks.add(table[1], {fwd, last_fwd});  // [F1,F0]: 0.7 and 1.0; stage 0 sends F1's activation: both 1.0
  expect_ends(1.0, 1.0, "tick 1");
  clocks.add_pooled(1.7);  // [-,B0]
  expect_ends(2.7, 2.7, "tick 2");
  clocks.add(table[3], {bwd, last_fwd});  // [B0,F1]: nothing sent, neither waits
  expect_ends(3.3, 3.2, "tick 3");
  clocks.add(table[4], {fwd, last_bwd});  // [F2,B1]: 3.5 and 4.7, then they meet
  expect_ends(4.7, 4.7, "tick 4");
  clocks.add(table[5], {bwd, last_fwd});  // [B1,F2]: nothing sent
  expect_ends(5.3, 5.2, "tick 5");
  clocks.add(table[6], {fwd, last_bwd});  // [F3,B2]: 5.5 and 6.7, then they meet
  expect_ends(6.7, 6.7, "tick 6");
  clocks.add(table[7], {bwd, last_fwd});  // [B2,F3]: nothing sent
  expect_ends(7.3, 7.2, "tick 7");
  // [-,B3]: stage 1 is done at 7.2, but the tick's first call waits for stage 0 (7.3): both end at 7.3 + 2.0,
  // not stage 1 at 7.2 + 2.0.
  clocks.add_pooled(2.0);
  expect_ends(9.3, 9.3, "tick 8");
  clocks.add_pooled(0.8);  // [B3,-]
  expect_ends(10.1, 10.1, "tick 9");
  EXPECT_NEAR(clocks.seconds(), 10.1, 1e-12);

  // With replicas every rank of every stage meets: 2 stages x 2 replicas after a steady tick with no send.
  sim::OneFOneBClocks replicas(sim::PipelinePool::kBubble, 2, 2, 1);
  replicas.add(table[3], {own(0.4), own(0.2), own(0.1), own(0.3)});
  const std::vector<double> apart = {0.4, 0.2, 0.1, 0.3};
  for (size_t r = 0; r < 4; ++r) EXPECT_NEAR(replicas.ends()[r], apart[r], 1e-12) << "rank " << r;
  replicas.add_pooled(1.0);
  for (size_t r = 0; r < 4; ++r) EXPECT_NEAR(replicas.ends()[r], 1.4, 1e-12) << "rank " << r;

  // A bubble tick is pooled, not added as a steady one; only --pool bubble pools some ticks.
  EXPECT_THROW(clocks.add(table[0], {fwd, sim::TickRankTime{}}), std::invalid_argument);
  sim::OneFOneBClocks local(sim::PipelinePool::kLocal, 2, 1, 2);
  EXPECT_THROW(local.add_pooled(1.0), std::invalid_argument);
}

TEST(OneFOneBBubble, BubbleTicksPricedAsTickPoolingSteadyTicksAsLocal) {
  // PP = 2, DP = 1, M = 4: ticks 0, 2, 8, 9 pooled, the others local. A bubble tick must be priced exactly as the
  // --pool tick run prices it (its operations' plans over every rank, the idle stage serving), a steady tick
  // exactly as colocated (no plan moves anything, no exchange) -- including tick 3's B0 on stage 0, whose F0 ran
  // pooled at tick 0, and tick 2's B0 on stage 1, pooled with its recomputed forward though its F0 ran locally.
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::pipeline_system();
  const auto bubble =
      sim::simulate(one_f_one_b(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kBubble, &tcal), cal, *rates);
  const auto tick =
      sim::simulate(one_f_one_b(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kTick, &tcal), cal, *rates);
  ASSERT_EQ(bubble.size(), 2u);
  EXPECT_EQ(bubble[1].group_size, 2);  // its pooled ticks plan over every rank
  const std::vector<sim::TickDetail>& b = bubble[1].ticks;
  ASSERT_EQ(b.size(), 10u);
  const std::vector<bool> is_bubble = {true, false, true, false, false, false, false, false, true, true};
  // The step written out: steady ticks as two_stage_clocks (each rank alone, the stages meeting where they
  // send), a bubble tick starting every rank at the latest clock, all ending together after its seconds.
  std::vector<double> clock(2, 0.0);
  for (size_t i = 0; i < b.size(); ++i) {
    const sim::TickDetail& same = is_bubble[i] ? tick[1].ticks[i] : bubble[0].ticks[i];  // tick-pooled or colocated
    EXPECT_EQ(b[i].pool, is_bubble[i] ? sim::PipelinePool::kTick : sim::PipelinePool::kLocal) << "tick " << i;
    EXPECT_NEAR(b[i].seconds, same.seconds, 1e-12) << "tick " << i;
    EXPECT_EQ(b[i].plan_documents, same.plan_documents) << "tick " << i;
    ASSERT_EQ(b[i].ranks.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_NEAR(b[i].ranks[r].non_attention, same.ranks[r].non_attention, 1e-12) << "tick " << i << " rank " << r;
      EXPECT_NEAR(b[i].ranks[r].attention, same.ranks[r].attention, 1e-12) << "tick " << i << " rank " << r;
      EXPECT_NEAR(b[i].ranks[r].exchange, same.ranks[r].exchange, 1e-12) << "tick " << i << " rank " << r;
      // In a bubble tick the idle stage serves too (one exchange per call); in a steady one nothing moves.
      if (is_bubble[i]) {
        EXPECT_GT(b[i].ranks[r].exchange, 0) << "tick " << i << " rank " << r;
      } else {
        EXPECT_DOUBLE_EQ(b[i].ranks[r].exchange, 0) << "tick " << i << " rank " << r;
      }
    }
    if (is_bubble[i]) {
      const double start = std::max(clock[0], clock[1]);
      clock = {start + b[i].seconds, start + b[i].seconds};
    } else {
      for (size_t r = 0; r < 2; ++r) clock[r] += 2 * b[i].ranks[r].total + b[i].ranks[r].head;
      const bool meet = (b[i].ops[0].micro_batch >= 0 && !b[i].ops[0].backward) ||
                        (b[i].ops[1].micro_batch >= 0 && b[i].ops[1].backward);
      if (meet) clock[0] = clock[1] = std::max(clock[0], clock[1]);
    }
    ASSERT_EQ(b[i].rank_ends.size(), 2u) << "tick " << i;
    for (size_t r = 0; r < 2; ++r) EXPECT_NEAR(b[i].rank_ends[r], clock[r], 1e-12) << "tick " << i << " rank " << r;
  }
  EXPECT_NEAR(bubble[1].off.mean_step_seconds, std::max(clock[0], clock[1]) + tcal.step_fixed_ms * 1e-3, 1e-12);
  // It borrows from both runs tick by tick, and is neither.
  EXPECT_NE(bubble[1].off.mean_step_seconds, tick[1].off.mean_step_seconds);
  EXPECT_NE(bubble[1].off.mean_step_seconds, bubble[0].off.mean_step_seconds);
  EXPECT_GT(bubble[1].bytes_per_layer, 0);
  EXPECT_LT(bubble[1].bytes_per_layer, tick[1].bytes_per_layer);  // fewer plans move work
}

TEST(OneFOneBBubble, WithFewerMicroBatchesThanStagesEveryTickIsPooled) {
  // M = 2, PP = 3: some stage is idle at every tick, so --pool bubble is --pool tick, step and all.
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::pipeline_system();
  const auto run = [&](sim::PipelinePool pool) {
    sim::Scenario s = one_f_one_b(3, 1, {"prefix_aware"}, pool, &tcal);
    s.shape.layers = 6;  // 2 per stage
    s.microbatches = 2;
    s.batch_seeds = {1001, 1002};
    return sim::simulate(s, cal, *rates);
  };
  const auto bubble = run(sim::PipelinePool::kBubble);
  const auto tick = run(sim::PipelinePool::kTick);
  ASSERT_EQ(bubble[0].ticks.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(bubble[0].ticks[i].pool, sim::PipelinePool::kTick) << "tick " << i;
    EXPECT_NEAR(bubble[0].ticks[i].seconds, tick[0].ticks[i].seconds, 1e-12) << "tick " << i;
  }
  EXPECT_NEAR(bubble[0].off.mean_step_seconds, tick[0].off.mean_step_seconds, 1e-12);
  EXPECT_NEAR(bubble[0].bytes_per_layer, tick[0].bytes_per_layer, 1e-6);
}

TEST(OneFOneBBubble, ReplicasMeetOnlyAtBubbleTicks) {
  // PP = 2, DP = 2: in a bubble tick all four ranks end together at the latest clock before it + its seconds; in
  // the steady ticks each replica is a pipeline of its own, so the replicas' clocks part.
  const sim::TrainerCalibration tcal = sim::testing::pipeline_trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const auto r = sim::simulate(one_f_one_b(2, 2, {"prefix_aware"}, sim::PipelinePool::kBubble, &tcal),
                               sim::testing::pipeline_system(), *rates);
  ASSERT_EQ(r[0].group_size, 4);
  const std::vector<sim::TickDetail>& t = r[0].ticks;
  ASSERT_EQ(t.size(), 10u);
  bool parted = false;
  std::vector<double> before(4, 0.0);
  for (size_t i = 0; i < t.size(); ++i) {
    ASSERT_EQ(t[i].rank_ends.size(), 4u);
    if (t[i].pool == sim::PipelinePool::kTick) {
      const double start = *std::max_element(before.begin(), before.end());
      for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(t[i].rank_ends[k], start + t[i].seconds, 1e-12) << "tick " << i;
    } else {
      parted = parted || t[i].rank_ends[0] != t[i].rank_ends[1];
    }
    before = t[i].rank_ends;
  }
  EXPECT_TRUE(parted);  // the replicas' batches differ, and so do their steady ticks
  EXPECT_NEAR(r[0].off.mean_step_seconds, t.back().rank_ends[0] + tcal.step_fixed_ms * 1e-3, 1e-12);
}
