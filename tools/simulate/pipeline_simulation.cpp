// pipeline_simulation.cpp -- the --schedule gpipe driver (see pipeline_simulation.h).
#include "pipeline_simulation.h"

#include "pipeline_driver.h"

namespace cad::simulate {

std::vector<BalancerResult> simulate_gpipe(const Scenario& s, const SystemCalibration& cal,
                                           const AttentionRates& rates, const cad_cost_params_v1_t& cost) {
  const int64_t dp = s.layout.dp();
  const int64_t pp = s.layout.pp;
  const int64_t layers = s.shape.layers / pp;
  const cad::plan::ModelParams params = cad::plan::model_params(cost);
  const std::vector<GpipeTick> schedule = gpipe_schedule(pp, s.microbatches);
  const int64_t forward_ticks = static_cast<int64_t>(schedule.size()) / 2;

  const int64_t steps = pipeline_steps(s);
  const double per_tick = 1.0 / static_cast<double>(steps * forward_ticks);
  const double per_micro_batch = 1.0 / static_cast<double>(steps * s.microbatches);
  return run_pipeline(s, [&](int64_t step, const std::vector<cad::plan::RankPieces>& batches, BalancerResult& res,
                             BalancerRunner& runner, PipelinePool pool) {
    // The plans of the forward ticks; backward tick b reuses forward tick T - 1 - b's.
    std::vector<PipelinePlan> plans(static_cast<size_t>(forward_ticks));
    for (int64_t t = 0; t < forward_ticks; ++t) {
      const GpipeTick& tick = schedule[static_cast<size_t>(t)];
      PipelinePlan& plan = plans[static_cast<size_t>(t)];
      // --pool bubble: tick pooling in a bubble tick, local attention in a steady one.
      const PipelinePool tick_pool = gpipe_tick_pool(pool, pp, s.microbatches, t);
      std::vector<cad::plan::RankPieces> stage_pieces;  // idle stages hold nothing
      for (const int64_t m : tick.micro_batch) {
        stage_pieces.push_back(m < 0 ? cad::plan::RankPieces(static_cast<size_t>(dp))
                                     : batches[static_cast<size_t>(m)]);
      }
      if (tick_pool == PipelinePool::kTick) {
        // One plan over the union of the stages' documents, every rank a server.
        plan_every_rank(runner, stage_pieces, cost, params, s.layout, rates, plan);
      } else {
        // Each stage on its own, in groups of group_size replicas (1 for local: each rank its own documents).
        const int64_t group = tick_pool == PipelinePool::kLocal ? 1 : res.stage_group_size;
        for (int64_t st = 0; st < pp; ++st) {
          if (tick.micro_batch[static_cast<size_t>(st)] < 0) {  // idle: no documents, no plan, no calls
            plan.work.insert(plan.work.end(), static_cast<size_t>(dp), RankWork{});
            continue;
          }
          plan_stage(runner, stage_pieces[static_cast<size_t>(st)], st, group, cost, params, s.layout, rates, plan);
        }
      }
      // Over the ranks that do attention in this tick: all of them under tick pooling (idle ones serve), else
      // the ranks running a micro-batch (an idle stage's zeros would only measure the bubble).
      std::vector<double> kernels;
      for (const RankWork& w : plan.work) {
        if (w.tokens == 0 && tick_pool != PipelinePool::kTick) continue;
        kernels.push_back(w.attention.fwd + w.attention.bwd);
      }
      res.attention_imbalance += per_tick * kernel_imbalance(kernels);
      res.bytes_per_layer += per_tick * plan.bytes;
      res.plan_ms += per_micro_batch * plan.plan_ms;
    }

    StepClock clock(dp, layers);
    for (const GpipeTick& tick : schedule) {
      const int64_t forward_index = tick.backward ? forward_ticks - 1 - tick.index : tick.index;
      const PipelinePlan& plan = plans[static_cast<size_t>(forward_index)];
      // The backward tick is pooled as the forward tick it mirrors (the trainer switches both alike).
      const PipelinePool tick_pool = gpipe_tick_pool(pool, pp, s.microbatches, forward_index);
      std::vector<TickRankTime> ranks;
      ranks.reserve(plan.work.size());
      for (size_t r = 0; r < plan.work.size(); ++r) {
        const int64_t stage = static_cast<int64_t>(r) / dp;
        const bool runs = tick.micro_batch[static_cast<size_t>(stage)] >= 0;
        // Under tick pooling an idle rank still joins every call (with 0 tokens) and serves.
        const bool joins = runs || tick_pool == PipelinePool::kTick;
        ranks.push_back(tick_rank_time(plan.work[r], tick.backward, joins, tick_pool != PipelinePool::kLocal,
                                       stage == pp - 1, cal, *s.trainer, s.trainer_options));
      }
      const RankTime critical = gpipe_tick_critical_path(ranks, layers, tick_pool);
      clock.add(ranks, tick_pool, critical.total);
      add_tick(res, ranks, critical, layers, per_micro_batch);
      if (s.detail) {
        TickDetail d;
        d.step = step;
        d.tick = tick;
        d.ranks = std::move(ranks);
        d.seconds = critical.total;
        d.plan_documents = plan.documents;
        d.pool = tick_pool;
        res.ticks.push_back(std::move(d));
      }
    }
    return clock.seconds();
  });
}

}  // namespace cad::simulate
