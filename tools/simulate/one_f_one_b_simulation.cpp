// one_f_one_b_simulation.cpp -- the --schedule 1f1b_ticks driver (see one_f_one_b_simulation.h).
#include "one_f_one_b_simulation.h"

#include <memory>

#include "pipeline_driver.h"

namespace cad::simulate {

std::vector<BalancerResult> simulate_1f1b_ticks(const Scenario& s, const SystemCalibration& cal,
                                                const AttentionRates& rates, const cad_cost_params_v1_t& cost) {
  const int64_t dp = s.layout.dp();
  const int64_t pp = s.layout.pp;
  const int64_t layers = s.shape.layers / pp;
  const int64_t micro_batches = s.microbatches;
  const cad::plan::ModelParams params = cad::plan::model_params(cost);
  const std::vector<std::vector<StageOp>> table = one_f_one_b_schedule(pp, micro_batches);

  const int64_t steps = pipeline_steps(s);
  const double per_tick = 1.0 / static_cast<double>(steps * static_cast<int64_t>(table.size()));
  const double per_micro_batch = 1.0 / static_cast<double>(steps * micro_batches);
  // Bytes per GPipe forward tick (M + PP - 1 of them per step), so that the two schedules' bytes compare: both
  // plan every (micro-batch, stage)'s documents once per step.
  const double per_forward_tick = 1.0 / static_cast<double>(steps * (micro_batches + pp - 1));
  return run_pipeline(s, [&](int64_t step, const std::vector<cad::plan::RankPieces>& batches, BalancerResult& res,
                             BalancerRunner& runner, PipelinePool pool) {
    // Which plans each (micro-batch m, stage st) needs, at m x PP + st: over every rank for an operation in a
    // tick priced under tick pooling, per stage (local: one rank each) for the others. Under --pool bubble one
    // (m, st) can need both, its forward in a bubble tick and its backward in a steady one or the other way
    // round: with full checkpointing the backward recomputes its forward under its own tick's attention.
    const size_t n_plans = static_cast<size_t>(micro_batches * pp);
    std::vector<bool> needs_every_rank(n_plans, false), needs_per_stage(n_plans, false);
    for (const std::vector<StageOp>& ops : table) {
      const bool pooled = one_f_one_b_tick_pool(pool, ops) == PipelinePool::kTick;
      for (int64_t st = 0; st < pp; ++st) {
        const int64_t m = ops[static_cast<size_t>(st)].micro_batch;
        if (m < 0) continue;
        (pooled ? needs_every_rank : needs_per_stage)[static_cast<size_t>(m * pp + st)] = true;
      }
    }
    // --pool bubble's steady ticks are local attention: each rank its own documents; --pool stage plans in the
    // balancer's groups (local runs have group size 1).
    const int64_t stage_group = pool == PipelinePool::kBubble ? 1 : res.group_size;
    // Every rank's work (stage-major) in each plan; a plan not needed stays empty (no tick reads it).
    std::vector<std::vector<RankWork>> every_rank_plans(n_plans), per_stage_plans(n_plans);
    std::vector<int64_t> every_rank_documents(n_plans, 0), per_stage_documents(n_plans, 0);
    for (int64_t m = 0; m < micro_batches; ++m) {
      for (int64_t st = 0; st < pp; ++st) {
        const size_t i = static_cast<size_t>(m * pp + st);
        for (const bool every_rank : {true, false}) {
          if (!(every_rank ? needs_every_rank[i] : needs_per_stage[i])) continue;
          PipelinePlan plan;
          if (every_rank) {
            // Over every rank, only stage st's holding documents: its replicas' buffers of micro-batch m.
            std::vector<cad::plan::RankPieces> stage_pieces(static_cast<size_t>(pp),
                                                            cad::plan::RankPieces(static_cast<size_t>(dp)));
            stage_pieces[static_cast<size_t>(st)] = batches[static_cast<size_t>(m)];
            plan_every_rank(runner, stage_pieces, cost, params, s.layout, rates, plan);
          } else {
            // Stage st's replicas alone; the other stages' entries stay empty (they take no part in its calls).
            plan.work.resize(static_cast<size_t>(st * dp));
            plan_stage(runner, batches[static_cast<size_t>(m)], st, stage_group, cost, params, s.layout, rates,
                       plan);
            plan.work.resize(static_cast<size_t>(pp * dp));
          }
          res.bytes_per_layer += per_forward_tick * plan.bytes;
          res.plan_ms += per_micro_batch * plan.plan_ms;
          (every_rank ? every_rank_documents : per_stage_documents)[i] = plan.documents;
          (every_rank ? every_rank_plans : per_stage_plans)[i] = std::move(plan.work);
        }
      }
    }

    // Tick pooling: every call meets every rank, so the step is the sum of its ticks. Local and per stage: the
    // stages meet only where they send to each other (pipeline_model.h OneFOneBClocks). Bubble: those clocks in
    // the steady ticks, every rank meeting at a bubble tick (OneFOneBClocks::add_pooled).
    double tick_sum = 0;
    std::unique_ptr<OneFOneBClocks> clocks;
    if (pool != PipelinePool::kTick) clocks = std::make_unique<OneFOneBClocks>(pool, pp, dp, layers);
    for (size_t t = 0; t < table.size(); ++t) {
      const std::vector<StageOp>& ops = table[t];
      const PipelinePool tick_pool = one_f_one_b_tick_pool(pool, ops);
      const bool pooled = tick_pool == PipelinePool::kTick;
      PricedTick priced = one_f_one_b_tick(ops, pooled ? every_rank_plans : per_stage_plans, dp, layers, tick_pool,
                                           cal, *s.trainer, s.trainer_options);
      // Imbalance over the ranks that do attention in this tick: all of them under tick pooling (every rank
      // serves every call), else the ranks running an operation (an idle stage's zeros would only measure the
      // bubble).
      std::vector<double> kernels;
      for (size_t r = 0; r < priced.ranks.size(); ++r) {
        if (!pooled && ops[r / static_cast<size_t>(dp)].micro_batch < 0) continue;
        kernels.push_back(priced.ranks[r].kernel);
      }
      res.attention_imbalance += per_tick * kernel_imbalance(kernels);
      tick_sum += priced.critical.total;
      if (clocks && pooled) {
        clocks->add_pooled(priced.critical.total);
      } else if (clocks) {
        clocks->add(ops, priced.ranks);
      }
      add_tick(res, priced.ranks, priced.critical, layers, per_micro_batch);
      if (s.detail) {
        TickDetail d;
        d.step = step;
        d.tick.index = static_cast<int64_t>(t);
        const std::vector<int64_t>& documents = pooled ? every_rank_documents : per_stage_documents;
        for (int64_t st = 0; st < pp; ++st) {
          const int64_t m = ops[static_cast<size_t>(st)].micro_batch;
          d.tick.micro_batch.push_back(m);
          if (m >= 0) d.plan_documents += documents[static_cast<size_t>(m * pp + st)];
        }
        d.ops = ops;
        d.ranks = std::move(priced.ranks);
        d.seconds = priced.critical.total;
        if (clocks) d.rank_ends = clocks->ends();
        d.pool = tick_pool;
        res.ticks.push_back(std::move(d));
      }
    }
    return clocks ? clocks->seconds() : tick_sum;
  });
}

}  // namespace cad::simulate
