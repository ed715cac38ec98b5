// The GPipe pipeline trainer's model (tools/simulate/pipeline_model.h, pipeline_simulation.h): the
// schedule's bookkeeping, one tick's price by hand, how the pools compose a tick, and the driver with the real
// balancer plugins (stage pooling with one replica is colocated, tick pooling plans the union of the stages'
// documents and lets idle stages serve) and its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#include "batch_recipe.h"
#include "pipeline_driver.h"
#include "pipeline_fixture.h"
#include "pipeline_model.h"
#include "plan_work.h"
#include "simulation.h"

namespace sim = cad::simulate;

namespace {

sim::TrainerCalibration trainer() { return sim::testing::pipeline_trainer(); }
sim::SystemCalibration system() { return sim::testing::pipeline_system(); }
using sim::testing::pipeline;
using sim::testing::refusal;

}  // namespace

TEST(GpipeSchedule, TicksAndMicroBatchesPerStage) {
  // 2 stages, 4 micro-batches: T = 5 forward ticks, then 5 backward.
  const std::vector<sim::GpipeTick> t = sim::gpipe_schedule(2, 4);
  ASSERT_EQ(t.size(), 10u);
  const std::vector<std::vector<int64_t>> expected = {{0, -1}, {1, 0}, {2, 1}, {3, 2}, {-1, 3},   // forward
                                                      {-1, 3}, {3, 2}, {2, 1}, {1, 0}, {0, -1}};  // backward
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].micro_batch, expected[i]) << "tick " << i;
    EXPECT_EQ(t[i].backward, i >= 5) << "tick " << i;
    EXPECT_EQ(t[i].index, static_cast<int64_t>(i % 5)) << "tick " << i;
  }
  // Any shape: 2 (M + PP - 1) ticks; every stage runs every micro-batch once forward and once backward, stage s
  // at forward tick m + s; it is idle for PP - 1 ticks of each phase; backward tick b mirrors forward T - 1 - b.
  for (int64_t pp : {2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 5, 16}) {
      const std::vector<sim::GpipeTick> ticks = sim::gpipe_schedule(pp, m);
      const int64_t T = m + pp - 1;
      ASSERT_EQ(static_cast<int64_t>(ticks.size()), 2 * T);
      for (int64_t s = 0; s < pp; ++s) {
        std::vector<int64_t> forward_runs(static_cast<size_t>(m), 0), backward_runs(static_cast<size_t>(m), 0);
        int64_t idle = 0;
        for (int64_t i = 0; i < 2 * T; ++i) {
          const sim::GpipeTick& k = ticks[static_cast<size_t>(i)];
          const int64_t mb = k.micro_batch[static_cast<size_t>(s)];
          if (mb < 0) {
            ++idle;
            continue;
          }
          (k.backward ? backward_runs : forward_runs)[static_cast<size_t>(mb)]++;
          if (k.backward) {
            EXPECT_EQ(ticks[static_cast<size_t>(T - 1 - k.index)].micro_batch, k.micro_batch);
          } else {
            EXPECT_EQ(k.index, mb + s);
          }
        }
        EXPECT_EQ(idle, 2 * (pp - 1)) << "pp " << pp << " m " << m << " stage " << s;
        for (int64_t j = 0; j < m; ++j) {
          EXPECT_EQ(forward_runs[static_cast<size_t>(j)], 1);
          EXPECT_EQ(backward_runs[static_cast<size_t>(j)], 1);
        }
      }
    }
  }
  EXPECT_THROW(sim::gpipe_schedule(0, 4), std::invalid_argument);
  EXPECT_THROW(sim::gpipe_schedule(2, 0), std::invalid_argument);
}

TEST(GpipeTick, OneRankByHand) {
  const sim::TrainerCalibration tcal = trainer();
  sim::TrainerOptions options;  // full checkpointing, kernel scale 1
  sim::RankWork w;
  w.tokens = 1000;
  w.attention.fwd = 0.010;
  w.attention.bwd = 0.025;
  // Forward tick, last stage: 1 of the layer's 4 forward units, a quarter of the head (its logits are recomputed
  // in the backward), one call's kernel + cost.
  sim::TickRankTime f = sim::tick_rank_time(w, false, true, false, true, system(), tcal, options);
  EXPECT_NEAR(f.non_attention, 1000 * 4e-6 / 4, 1e-12);
  EXPECT_NEAR(f.head, 1000 * 9e-6 / 4, 1e-12);
  EXPECT_NEAR(f.attention, 0.010 + 0.001, 1e-12);
  EXPECT_DOUBLE_EQ(f.exchange, 0);
  // Backward tick: the recomputation and the backward (3 units), three quarters of the head, two calls.
  sim::TickRankTime b = sim::tick_rank_time(w, true, true, false, true, system(), tcal, options);
  EXPECT_NEAR(b.non_attention, 1000 * 4e-6 * 3 / 4, 1e-12);
  EXPECT_NEAR(b.head, 1000 * 9e-6 * 3 / 4, 1e-12);
  EXPECT_NEAR(b.attention, 0.010 + 0.025 + 0.002, 1e-12);
  // Forward + backward tick = the data-parallel trainer model's micro-batch per layer (same calibration).
  EXPECT_NEAR(f.non_attention + b.non_attention, 1000 * 4e-6, 1e-12);
  EXPECT_NEAR(f.head + b.head, 1000 * 9e-6, 1e-12);
  // Not the last stage: no head. Without checkpointing the backward tick has no recomputation.
  EXPECT_DOUBLE_EQ(sim::tick_rank_time(w, true, true, false, false, system(), tcal, options).head, 0);
  options.checkpointing = false;
  sim::TickRankTime nb = sim::tick_rank_time(w, true, true, false, true, system(), tcal, options);
  EXPECT_NEAR(nb.non_attention, 1000 * 4e-6 * 2 / 4, 1e-12);
  EXPECT_NEAR(nb.attention, 0.025 + 0.001, 1e-12);
  // A rank that does not join the tick's calls (idle, local attention) pays nothing.
  sim::RankWork none;
  const sim::TickRankTime idle = sim::tick_rank_time(none, false, false, true, true, system(), tcal, options);
  EXPECT_DOUBLE_EQ(idle.total + idle.head, 0);
  // An idle rank under tick pooling joins the calls (fixed cost, exchange fixed cost) and serves its shards.
  sim::RankWork served;
  served.attention.fwd = 0.004;
  const sim::TickRankTime serving = sim::tick_rank_time(served, false, true, true, false, system(), tcal, options);
  EXPECT_DOUBLE_EQ(serving.non_attention, 0);
  EXPECT_NEAR(serving.attention, 0.004 + 0.001, 1e-12);
  EXPECT_NEAR(serving.exchange, 100e-6, 1e-12);  // no bytes: the fixed part only
}

TEST(GpipeTick, PoolsComposeTheTick) {
  sim::TickRankTime a, b;
  a.non_attention = 0.010;
  a.attention = 0.002;
  a.total = 0.012;
  b.non_attention = 0.004;
  b.attention = 0.009;
  b.exchange = 0.001;
  b.head = 0.050;
  b.total = 0.014;
  // Local: the slowest rank alone (2 layers): max(2 x 0.012, 2 x 0.014 + 0.05).
  EXPECT_NEAR(sim::tick_seconds({a, b}, 2, sim::PipelinePool::kLocal), 2 * 0.014 + 0.05, 1e-12);
  EXPECT_NEAR(sim::tick_seconds({a, b}, 2, sim::PipelinePool::kStage), 2 * 0.014 + 0.05, 1e-12);
  // Tick: lockstep per layer: the slowest non-attention, then the slowest server with its exchange; + head.
  EXPECT_NEAR(sim::tick_seconds({a, b}, 2, sim::PipelinePool::kTick), 2 * (0.010 + 0.010) + 0.05, 1e-12);
  // Lockstep is never faster than the slowest rank alone.
  EXPECT_GE(sim::tick_seconds({a, b}, 2, sim::PipelinePool::kTick), sim::tick_seconds({a, b}, 2, sim::PipelinePool::kLocal));
}

TEST(GpipeRun, StagePoolWithOneReplicaPricesLikeColocated) {
  const sim::TrainerCalibration tcal = trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::Scenario s = pipeline(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kStage, &tcal);
  const std::vector<sim::BalancerResult> r = sim::simulate(s, system(), *rates);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].group_size, 1);
  ASSERT_EQ(r[0].off.step_seconds.size(), 1u);
  EXPECT_NEAR(r[1].off.mean_step_seconds, r[0].off.mean_step_seconds, 1e-9 * r[0].off.mean_step_seconds);
  EXPECT_DOUBLE_EQ(r[1].bytes_per_layer, 0);
  // The step is the sum of its 10 ticks plus the fixed part.
  ASSERT_EQ(r[0].ticks.size(), 10u);
  double sum = tcal.step_fixed_ms * 1e-3;
  for (const auto& t : r[0].ticks) sum += t.seconds;
  EXPECT_NEAR(r[0].off.mean_step_seconds, sum, 1e-12);
  // Ping-pong is not modelled for the pipeline: on = off.
  EXPECT_DOUBLE_EQ(r[0].on.mean_step_seconds, r[0].off.mean_step_seconds);
}

TEST(GpipeRun, LocalReplicasArePipelinesOfTheirOwn) {
  // PP = 2 x DP = 2, colocated: the step is the slowest replica's own sum of ticks, which is at most the sum
  // over ticks of the slowest rank of all (what CAD per stage, coupling the replicas at every call, pays).
  const sim::TrainerCalibration tcal = trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::Scenario s = pipeline(2, 2, {"colocated"}, sim::PipelinePool::kStage, &tcal);
  const std::vector<sim::BalancerResult> r = sim::simulate(s, system(), *rates);
  ASSERT_EQ(r[0].ticks.size(), 10u);
  double replica[2] = {0, 0}, coupled = 0;
  for (const auto& t : r[0].ticks) {
    ASSERT_EQ(t.ranks.size(), 4u);
    coupled += t.seconds;
    for (int rep = 0; rep < 2; ++rep) {
      replica[rep] += sim::tick_seconds({t.ranks[static_cast<size_t>(rep)], t.ranks[static_cast<size_t>(2 + rep)]},
                                        2, sim::PipelinePool::kLocal);
    }
  }
  const double fixed = tcal.step_fixed_ms * 1e-3;
  EXPECT_NEAR(r[0].off.mean_step_seconds, std::max(replica[0], replica[1]) + fixed, 1e-12);
  EXPECT_LE(r[0].off.mean_step_seconds, coupled + fixed + 1e-12);
  EXPECT_NE(replica[0], replica[1]);  // the replicas hold different buffers
}

TEST(GpipeRun, TickPoolPlansTheUnionOfTheStagesDocuments) {
  const sim::TrainerCalibration tcal = trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::Scenario s = pipeline(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kTick, &tcal);
  const std::vector<sim::BalancerResult> r = sim::simulate(s, system(), *rates);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].group_size, 2);  // every rank of both stages
  // The documents of each micro-batch as the trainer samples it (one replica).
  std::vector<int64_t> docs;
  for (uint64_t seed : s.batch_seeds) {
    const cad::plan::RankPieces b = sim::documents_per_rank(cad::workload::sample_batch(s.lengths, s.context, 1, seed));
    docs.push_back(static_cast<int64_t>(b[0].size()));
  }
  const std::vector<sim::TickDetail>& ticks = r[1].ticks;
  ASSERT_EQ(ticks.size(), 10u);
  for (const sim::TickDetail& t : ticks) {
    int64_t expected = 0;
    for (int64_t m : t.tick.micro_batch) expected += m >= 0 ? docs[static_cast<size_t>(m)] : 0;
    EXPECT_EQ(t.plan_documents, expected) << (t.tick.backward ? "backward " : "forward ") << t.tick.index;
    ASSERT_EQ(t.ranks.size(), 2u);
    for (size_t st = 0; st < 2; ++st) {
      const bool runs = t.tick.micro_batch[st] >= 0;
      EXPECT_EQ(t.ranks[st].tokens, runs ? s.context : 0);
      // Under tick pooling every rank serves attention kernels (beyond its calls' fixed cost), the idle stage too.
      const double calls_s = (t.tick.backward ? 2 : 1) * tcal.attention_call_us * 1e-6;
      EXPECT_GT(t.ranks[st].attention, calls_s + 1e-4) << "tick " << t.tick.index << " stage " << st;
      EXPECT_GT(t.ranks[st].exchange, 0);
    }
  }
  // Colocated: the idle stage does nothing; its attention is 0.
  EXPECT_DOUBLE_EQ(r[0].ticks[0].ranks[1].attention, 0);
  EXPECT_DOUBLE_EQ(r[0].ticks[0].ranks[1].total, 0);
  // Tick pooling balances the tick's attention across the stages: lower imbalance than colocated.
  EXPECT_LT(r[1].attention_imbalance, r[0].attention_imbalance);
  EXPECT_GT(r[1].bytes_per_layer, 0);
}

TEST(GpipeBubble, BubbleTicksAreTheFillAndDrain) {
  // train_pipeline.py bubble_tick: some stage idle at forward tick t, i.e. t < PP - 1 or t >= M.
  const std::vector<bool> two_by_four = {true, false, false, false, true};  // PP = 2, M = 4: [0,-] ... [-,3]
  for (int64_t t = 0; t < 5; ++t) {
    EXPECT_EQ(sim::gpipe_bubble_tick(2, 4, t), two_by_four[static_cast<size_t>(t)]) << "tick " << t;
    EXPECT_EQ(sim::gpipe_tick_pool(sim::PipelinePool::kBubble, 2, 4, t),
              two_by_four[static_cast<size_t>(t)] ? sim::PipelinePool::kTick : sim::PipelinePool::kLocal);
    // The other pools are left as they are.
    EXPECT_EQ(sim::gpipe_tick_pool(sim::PipelinePool::kStage, 2, 4, t), sim::PipelinePool::kStage);
  }
  // Against the schedule itself, for several shapes: a bubble tick is one where some stage is idle.
  for (int64_t pp : {1, 2, 3, 4}) {
    for (int64_t m : {1, 2, 5, 8}) {
      const std::vector<sim::GpipeTick> schedule = sim::gpipe_schedule(pp, m);
      for (int64_t t = 0; t < m + pp - 1; ++t) {
        const std::vector<int64_t>& mb = schedule[static_cast<size_t>(t)].micro_batch;
        const bool idle = std::any_of(mb.begin(), mb.end(), [](int64_t x) { return x < 0; });
        EXPECT_EQ(sim::gpipe_bubble_tick(pp, m, t), idle) << "pp " << pp << " m " << m << " tick " << t;
      }
    }
  }
  EXPECT_THROW(sim::gpipe_bubble_tick(2, 4, 5), std::invalid_argument);  // past the forward ticks
  // A tick is priced tick-pooled or local, never "bubble".
  EXPECT_THROW(sim::tick_seconds({sim::TickRankTime{}}, 2, sim::PipelinePool::kBubble), std::invalid_argument);
}

TEST(GpipeBubble, BubbleTicksPricedAsTickPoolingSteadyTicksAsLocal) {
  // PP = 2, DP = 1, M = 4: forward ticks 0 and 4 (and backward ticks 4 and 0, which mirror them) are bubble
  // ticks; ticks 1-3 steady. Under --pool bubble a bubble tick must be priced exactly as the --pool tick run
  // prices it, a steady tick exactly as colocated (no plan moves anything, no exchange).
  const sim::TrainerCalibration tcal = trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const auto bubble =
      sim::simulate(pipeline(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kBubble, &tcal), system(), *rates);
  const auto tick =
      sim::simulate(pipeline(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kTick, &tcal), system(), *rates);
  ASSERT_EQ(bubble.size(), 2u);
  EXPECT_EQ(bubble[1].group_size, 2);  // its pooled ticks plan over every rank
  const std::vector<sim::TickDetail>& b = bubble[1].ticks;
  ASSERT_EQ(b.size(), 10u);
  int pooled = 0;
  double sum = tcal.step_fixed_ms * 1e-3;
  for (size_t i = 0; i < b.size(); ++i) {
    const int64_t forward_tick = b[i].tick.backward ? 4 - b[i].tick.index : b[i].tick.index;
    const bool is_bubble = forward_tick == 0 || forward_tick == 4;
    const sim::TickDetail& same = is_bubble ? tick[1].ticks[i] : bubble[0].ticks[i];  // tick-pooled or colocated
    EXPECT_EQ(b[i].pool, is_bubble ? sim::PipelinePool::kTick : sim::PipelinePool::kLocal) << "tick " << i;
    EXPECT_NEAR(b[i].seconds, same.seconds, 1e-12) << "tick " << i;
    ASSERT_EQ(b[i].ranks.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      EXPECT_NEAR(b[i].ranks[r].attention, same.ranks[r].attention, 1e-12) << "tick " << i << " rank " << r;
      EXPECT_NEAR(b[i].ranks[r].exchange, same.ranks[r].exchange, 1e-12) << "tick " << i << " rank " << r;
      // In a bubble tick the idle stage serves (attention, exchange); in a steady one nothing is exchanged.
      if (is_bubble) {
        EXPECT_GT(b[i].ranks[r].exchange, 0) << "tick " << i << " rank " << r;
      } else {
        EXPECT_DOUBLE_EQ(b[i].ranks[r].exchange, 0) << "tick " << i << " rank " << r;
      }
    }
    pooled += is_bubble ? 1 : 0;
    sum += b[i].seconds;
  }
  EXPECT_EQ(pooled, 4);
  // DP = 1: the step is the sum of its ticks, and it sits between the two runs it borrows from tick by tick.
  EXPECT_NEAR(bubble[1].off.mean_step_seconds, sum, 1e-12);
  EXPECT_NE(bubble[1].off.mean_step_seconds, tick[1].off.mean_step_seconds);
  EXPECT_NE(bubble[1].off.mean_step_seconds, bubble[0].off.mean_step_seconds);
}

TEST(GpipeBubbleStage, BubbleTicksPricedAsTickPoolingSteadyTicksAsStagePooling) {
  // PP = 2, DP = 2, M = 4: --pool bubble_stage prices a bubble tick exactly as the --pool tick run prices it and a
  // steady tick exactly as the --pool stage run does (CAD within each stage's two replicas).
  EXPECT_EQ(sim::gpipe_tick_pool(sim::PipelinePool::kBubbleStage, 2, 4, 0), sim::PipelinePool::kTick);
  EXPECT_EQ(sim::gpipe_tick_pool(sim::PipelinePool::kBubbleStage, 2, 4, 2), sim::PipelinePool::kStage);
  EXPECT_EQ(sim::gpipe_tick_pool(sim::PipelinePool::kBubbleStage, 2, 4, 4), sim::PipelinePool::kTick);
  const sim::TrainerCalibration tcal = trainer();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const std::vector<std::string> balancers = {"colocated", "prefix_aware"};
  const auto both = sim::simulate(pipeline(2, 2, balancers, sim::PipelinePool::kBubbleStage, &tcal), system(), *rates);
  const auto tick = sim::simulate(pipeline(2, 2, balancers, sim::PipelinePool::kTick, &tcal), system(), *rates);
  const auto stage = sim::simulate(pipeline(2, 2, balancers, sim::PipelinePool::kStage, &tcal), system(), *rates);
  ASSERT_EQ(both[1].ticks.size(), 10u);
  EXPECT_EQ(both[1].group_size, 4);        // the bubble ticks plan over every rank
  EXPECT_EQ(both[1].stage_group_size, 2);  // the steady ones over a stage's replicas
  for (size_t i = 0; i < both[1].ticks.size(); ++i) {
    const sim::TickDetail& b = both[1].ticks[i];
    const int64_t forward_tick = b.tick.backward ? 4 - b.tick.index : b.tick.index;
    const bool is_bubble = forward_tick == 0 || forward_tick == 4;
    const sim::TickDetail& same = is_bubble ? tick[1].ticks[i] : stage[1].ticks[i];
    EXPECT_EQ(b.pool, is_bubble ? sim::PipelinePool::kTick : sim::PipelinePool::kStage) << "tick " << i;
    EXPECT_NEAR(b.seconds, same.seconds, 1e-12) << "tick " << i;
    ASSERT_EQ(b.ranks.size(), 4u);
    for (size_t r = 0; r < 4; ++r) {
      EXPECT_NEAR(b.ranks[r].attention, same.ranks[r].attention, 1e-12) << "tick " << i << " rank " << r;
      EXPECT_NEAR(b.ranks[r].exchange, same.ranks[r].exchange, 1e-12) << "tick " << i << " rank " << r;
    }
  }
  // With one replica per stage, pooling per stage is local: bubble_stage is bubble.
  const auto one = sim::simulate(pipeline(2, 1, balancers, sim::PipelinePool::kBubbleStage, &tcal), system(), *rates);
  const auto bubble = sim::simulate(pipeline(2, 1, balancers, sim::PipelinePool::kBubble, &tcal), system(), *rates);
  EXPECT_NEAR(one[1].off.mean_step_seconds, bubble[1].off.mean_step_seconds, 1e-12);
  // 1F1B is not modelled with it.
  EXPECT_NE(refusal(pipeline(2, 2, balancers, sim::PipelinePool::kBubbleStage, &tcal, sim::Schedule::k1f1bTicks))
                .find("gpipe only"),
            std::string::npos);
}

TEST(GpipeBubble, StepClockLocalRunsBetweenCoupledTicks) {
  // DP = 2 (ranks stage-major: s0r0, s0r1, s1r0, s1r1), 1 layer. Two local ticks: replica 0 takes max(0.1, 0.2)
  // then 0.4, replica 1 max(0.3, 0.1) then 0.1: 0.6 and 0.4. A coupled tick of 1.0 starts when the slower
  // replica arrives (0.6). Then a local tick: replica 0 0.2, replica 1 0.5. Step = 0.6 + 1.0 + 0.5 = 2.1
  // (summing the slowest rank of every tick would give 0.3 + 0.4 + 1.0 + 0.5 = 2.2).
  const auto own = [](double total) {
    sim::TickRankTime t;
    t.total = total;
    return t;
  };
  const sim::TickRankTime idle;
  sim::StepClock clock(2, 1);
  clock.add({own(0.1), own(0.3), own(0.2), own(0.1)}, sim::PipelinePool::kLocal, 0.3);
  clock.add({own(0.4), own(0.1), idle, idle}, sim::PipelinePool::kLocal, 0.4);
  EXPECT_NEAR(clock.seconds(), 0.6, 1e-12);
  clock.add({own(0.5), own(0.5), own(0.5), own(0.5)}, sim::PipelinePool::kTick, 1.0);
  EXPECT_NEAR(clock.seconds(), 1.6, 1e-12);
  clock.add({own(0.2), own(0.5), idle, idle}, sim::PipelinePool::kLocal, 0.5);
  EXPECT_NEAR(clock.seconds(), 2.1, 1e-12);
}

TEST(GpipeRun, RefusalsNameTheProblem) {
  const sim::TrainerCalibration tcal = trainer();
  sim::Scenario s = pipeline(2, 1, {"colocated", "prefix_aware"}, sim::PipelinePool::kTick, &tcal);
  sim::Scenario one_stage = s;
  one_stage.layout = sim::Layout{1, 1, 1, 1};
  EXPECT_NE(refusal(one_stage).find("--schedule gpipe needs --pp >= 2"), std::string::npos) << refusal(one_stage);
  sim::Scenario no_trainer = s;
  no_trainer.trainer = nullptr;
  EXPECT_NE(refusal(no_trainer).find("needs --trainer FILE"), std::string::npos) << refusal(no_trainer);
  sim::Scenario cp = s;
  cp.balancers[1].name = "per_doc_cp";
  cp.balancers[1].plan_is_layout = true;
  EXPECT_NE(refusal(cp).find("'per_doc_cp' (its plan is the token layout) is not modelled"), std::string::npos)
      << refusal(cp);
  sim::Scenario local_pool = s;
  local_pool.pool = sim::PipelinePool::kLocal;
  EXPECT_NE(refusal(local_pool).find("--pool: expected tick, stage, bubble or bubble_stage"), std::string::npos)
      << refusal(local_pool);
  // 1F1B with the trainer calibration stays refused, and says what to use.
  sim::Scenario one_f_one_b = s;
  one_f_one_b.schedule = sim::Schedule::k1f1b;
  EXPECT_NE(refusal(one_f_one_b).find("cannot go with --pp 2"), std::string::npos) << refusal(one_f_one_b);
}
