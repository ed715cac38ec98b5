// pipeline_driver.h -- what the pipeline trainer's two drivers share (pipeline_simulation.h: --schedule gpipe;
// one_f_one_b_simulation.h: --schedule 1f1b_ticks): the loop over steps and balancers (each balancer and how it
// pools attention, a step's micro-batches), planning one stage's or every stage's documents, and adding priced
// ticks and steps to a result.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attention_rates.h"
#include "balancer_runner.h"
#include "cad_balancer_v1.h"
#include "pipeline_model.h"
#include "simulation.h"

namespace cad::simulate {

// Sampled steps: --steps, or the whole steps of --batch-seeds.
int64_t pipeline_steps(const Scenario& s);

// Prices one step of one balancer: `batches` are the step's micro-batches (each over the DP buffers: micro-batch
// m is the recipe batch with seed --seed + step x M + m, or the step x M + m-th of --batch-seeds; replica r holds
// buffer r); `pool` how the balancer pools attention (colocated, and CAD per stage over one replica, which moves
// nothing, are local). Adds its parts to `result` and returns the sum of the step's ticks (StepClock).
using PriceStep = std::function<double(int64_t step, const std::vector<cad::plan::RankPieces>& batches,
                                       BalancerResult& result, BalancerRunner& runner, PipelinePool pool)>;

// Loads the balancers and runs `price_step` for every step and balancer (saying so through
// Scenario::progress), adding each step's seconds + the trainer's step_fixed_ms to both modes (ping-pong is not
// modelled: on = off). Returns one result per balancer, in the scenario's order (named, group size set).
std::vector<BalancerResult> run_pipeline(const Scenario& s, const PriceStep& price_step);

// A plan (or one stage's group plans) and every rank's work in it.
struct PipelinePlan {
  std::vector<RankWork> work;  // stage-major: rank = stage x DP + replica
  double bytes = 0;            // forward bytes of one layer, all ranks
  double plan_ms = 0;          // the plugin's planning time
  int64_t documents = 0;       // documents in the plans
};

// Tick pooling: one plan over every rank, stage st's DP ranks holding stage_pieces[st] (an empty RankPieces of
// DP ranks: nothing; those ranks only serve). Appends every rank's work to `out`.
void plan_every_rank(BalancerRunner& runner, const std::vector<cad::plan::RankPieces>& stage_pieces,
                     const cad_cost_params_v1_t& cost, const cad::plan::ModelParams& params, const Layout& layout,
                     const AttentionRates& rates, PipelinePlan& out);

// Local and stage pooling: stage `stage`'s documents (`pieces`, its DP replicas') planned in groups of
// `group_size` replicas (1: each rank its own). Appends the stage's DP ranks' work to `out`.
void plan_stage(BalancerRunner& runner, const cad::plan::RankPieces& pieces, int64_t stage, int64_t group_size,
                const cad_cost_params_v1_t& cost, const cad::plan::ModelParams& params, const Layout& layout,
                const AttentionRates& rates, PipelinePlan& out);

// max / mean of per-rank kernel seconds; 1 when they sum to 0.
double kernel_imbalance(const std::vector<double>& kernel_seconds);

// Adds one priced tick, weighted per_micro_batch (1 / the run's micro-batches), to both modes of `result`
// (ping-pong is not modelled: on = off): the tick's critical path to `slowest`, each rank's own parts on
// average to `mean`.
void add_tick(BalancerResult& result, const std::vector<TickRankTime>& ranks, const RankTime& critical,
              int64_t layers_per_stage, double per_micro_batch);

// A GPipe step's clock. Under CAD a tick's calls couple the replicas of a stage (or every rank): such a tick
// starts when the last replica gets there and adds its seconds. Local attention couples nothing across
// replicas: replica r's stages form a pipeline of their own, which meets the others only at the next coupled
// tick or the step's gradient all-reduce, so a run of local ticks costs the slowest replica's sum of them, each
// tick priced over that replica's stages. (All ticks local: the slowest replica's sum; none: the ticks' sum;
// --pool bubble mixes the two.)
class StepClock {
 public:
  StepClock(int64_t dp, int64_t layers_per_stage);
  // `tick_pool`: the pool the tick was priced with (gpipe_tick_pool), kLocal or one that couples replicas.
  void add(const std::vector<TickRankTime>& ranks, PipelinePool tick_pool, double tick_seconds);
  double seconds() const;

 private:
  int64_t dp_, layers_;
  double sum_ = 0;
  std::vector<double> replica_;
};

}  // namespace cad::simulate
