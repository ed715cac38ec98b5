// pipeline_driver.cpp -- the pieces both pipeline-trainer drivers share (see pipeline_driver.h).
#include "pipeline_driver.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "batch_recipe.h"
#include "plan_work.h"

namespace cad::simulate {

namespace {

// Plans `pieces` (ranks first_rank.. of the layout) with the runner, appending each rank's work.
void plan_group(BalancerRunner& runner, const cad::plan::RankPieces& pieces, const cad_cost_params_v1_t& cost,
                const cad::plan::ModelParams& params, const Layout& layout, int64_t first_rank,
                const AttentionRates& rates, PipelinePlan& out) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<cad_task_v1_t> tasks = runner.plan(pieces, cost);
  out.plan_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  double bytes = 0;
  std::vector<RankWork> w = rank_work(pieces, tasks, params, layout, first_rank, rates, &bytes);
  out.bytes += bytes;
  out.work.insert(out.work.end(), w.begin(), w.end());
  for (const auto& rank : pieces) out.documents += static_cast<int64_t>(rank.size());
}

}  // namespace

int64_t pipeline_steps(const Scenario& s) {
  return s.batch_seeds.empty() ? s.steps : static_cast<int64_t>(s.batch_seeds.size()) / s.microbatches;
}

std::vector<BalancerResult> run_pipeline(const Scenario& s, const PriceStep& price_step) {
  const int64_t dp = s.layout.dp();
  std::vector<std::unique_ptr<BalancerRunner>> runners;
  std::vector<BalancerResult> results;
  std::vector<PipelinePool> pools;
  for (const auto& b : s.balancers) {
    runners.push_back(std::make_unique<BalancerRunner>(b.name, b.config, s.search_path));
    BalancerResult r;
    r.name = runners.back()->name();
    // Colocated is local attention; a CAD balancer within a stage of one replica moves nothing: local too.
    const int64_t stage_group = b.group_size == 0 ? dp : std::min(b.group_size, dp);
    PipelinePool pool = s.pool;
    if (r.name == "colocated" || (pool == PipelinePool::kStage && stage_group == 1)) pool = PipelinePool::kLocal;
    if (pool == PipelinePool::kBubbleStage && stage_group == 1) pool = PipelinePool::kBubble;  // stage pooling: local
    // Under --pool bubble(_stage) the pooled ticks' plans are over every rank (the steady ticks local or per stage).
    const bool every_rank = pool == PipelinePool::kTick || pool == PipelinePool::kBubble ||
                            pool == PipelinePool::kBubbleStage;
    r.group_size = every_rank ? s.layout.pp * dp : pool == PipelinePool::kStage ? stage_group : 1;
    r.stage_group_size = pool == PipelinePool::kStage || pool == PipelinePool::kBubbleStage ? stage_group : 1;
    r.off.pingpong = false;
    r.on.pingpong = true;
    pools.push_back(pool);
    results.push_back(r);
  }

  const int64_t steps = pipeline_steps(s);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<cad::plan::RankPieces> batches;
    for (int64_t m = 0; m < s.microbatches; ++m) {
      const size_t i = static_cast<size_t>(step * s.microbatches + m);
      const uint64_t seed = s.batch_seeds.empty() ? s.seed + i : s.batch_seeds[i];
      batches.push_back(
          documents_per_rank(cad::workload::sample_batch(s.lengths, s.context, static_cast<int32_t>(dp), seed)));
    }
    for (size_t bi = 0; bi < results.size(); ++bi) {
      BalancerResult& res = results[bi];
      if (s.progress) {
        s.progress("step " + std::to_string(step + 1) + "/" + std::to_string(steps) + ": " + res.name + " on " +
                   std::to_string(s.layout.pp) + " stages x " + std::to_string(dp) + " replicas");
      }
      const double step_s = price_step(step, batches, res, *runners[bi], pools[bi]) + s.trainer->step_fixed_ms * 1e-3;
      // Ping-pong is not modelled for the pipeline: "on" is priced as "off".
      res.off.step_seconds.push_back(step_s);
      res.on.step_seconds.push_back(step_s);
    }
  }
  set_mean_step_seconds(results);
  return results;
}

void plan_every_rank(BalancerRunner& runner, const std::vector<cad::plan::RankPieces>& stage_pieces,
                     const cad_cost_params_v1_t& cost, const cad::plan::ModelParams& params, const Layout& layout,
                     const AttentionRates& rates, PipelinePlan& out) {
  // The stages hold different micro-batches, whose document ids all start at 0: each stage's ids are shifted
  // past the previous stages' so that the plan sees distinct documents.
  cad::plan::RankPieces all;
  int64_t id_offset = 0;
  for (cad::plan::RankPieces p : stage_pieces) {
    int64_t next = id_offset;
    for (auto& rank : p) {
      for (auto& piece : rank) {
        piece.doc_id += id_offset;
        next = std::max(next, piece.doc_id + 1);
      }
    }
    id_offset = next;
    all.insert(all.end(), p.begin(), p.end());
  }
  plan_group(runner, all, cost, params, layout, 0, rates, out);
}

void plan_stage(BalancerRunner& runner, const cad::plan::RankPieces& pieces, int64_t stage, int64_t group_size,
                const cad_cost_params_v1_t& cost, const cad::plan::ModelParams& params, const Layout& layout,
                const AttentionRates& rates, PipelinePlan& out) {
  const int64_t dp = layout.dp();
  for (int64_t begin = 0; begin < dp; begin += group_size) {
    const int64_t end = std::min(dp, begin + group_size);
    plan_group(runner, group_pieces(pieces, begin, end), cost, params, layout, stage * dp + begin, rates, out);
  }
}

double kernel_imbalance(const std::vector<double>& kernel_seconds) {
  double max_k = 0, sum_k = 0;
  for (const double k : kernel_seconds) {
    max_k = std::max(max_k, k);
    sum_k += k;
  }
  return sum_k > 0 ? max_k * static_cast<double>(kernel_seconds.size()) / sum_k : 1.0;
}

void add_tick(BalancerResult& result, const std::vector<TickRankTime>& ranks, const RankTime& critical,
              int64_t layers_per_stage, double per_micro_batch) {
  const double l = static_cast<double>(layers_per_stage);
  const double per_rank = per_micro_batch / static_cast<double>(ranks.size());
  for (ModeResult* mr : {&result.off, &result.on}) {
    mr->slowest.linear += per_micro_batch * critical.linear;
    mr->slowest.attention += per_micro_batch * critical.attention;
    mr->slowest.comm += per_micro_batch * critical.comm;
    mr->slowest.comm_exposed += per_micro_batch * critical.comm_exposed;
    mr->slowest.total += per_micro_batch * critical.total;
    for (const TickRankTime& r : ranks) {
      mr->mean.linear += per_rank * (l * r.non_attention + r.head);
      mr->mean.attention += per_rank * l * r.attention;
      mr->mean.comm += per_rank * l * r.exchange;
      mr->mean.comm_exposed += per_rank * l * r.exchange;
      mr->mean.total += per_rank * (l * r.total + r.head);
    }
  }
}

StepClock::StepClock(int64_t dp, int64_t layers_per_stage)
    : dp_(dp), layers_(layers_per_stage), replica_(static_cast<size_t>(dp), 0.0) {}

void StepClock::add(const std::vector<TickRankTime>& ranks, PipelinePool tick_pool, double tick_seconds) {
  if (tick_pool != PipelinePool::kLocal) {
    // A tick whose calls couple the replicas: its first call waits for the last replica to get there.
    sum_ += *std::max_element(replica_.begin(), replica_.end()) + tick_seconds;
    std::fill(replica_.begin(), replica_.end(), 0.0);
    return;
  }
  const int64_t stages = static_cast<int64_t>(ranks.size()) / dp_;
  for (int64_t r = 0; r < dp_; ++r) {
    std::vector<TickRankTime> replica;
    for (int64_t st = 0; st < stages; ++st) replica.push_back(ranks[static_cast<size_t>(st * dp_ + r)]);
    replica_[static_cast<size_t>(r)] += simulate::tick_seconds(replica, layers_, PipelinePool::kLocal);
  }
}

double StepClock::seconds() const { return sum_ + *std::max_element(replica_.begin(), replica_.end()); }

}  // namespace cad::simulate
