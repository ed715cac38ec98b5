// pipeline_simulation.cpp -- the --schedule gpipe driver (see pipeline_simulation.h).
#include "pipeline_simulation.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "balancer_runner.h"
#include "batch_recipe.h"
#include "plan_work.h"

namespace cad::simulate {

namespace {

// One balancer's plan of one forward tick: every rank's work (rank = stage x DP + replica).
struct TickPlan {
  std::vector<RankWork> work;
  double bytes = 0;       // forward bytes of one layer, all ranks
  double plan_ms = 0;     // the plugin's planning time
  int64_t documents = 0;  // documents in the plans
  double imbalance = 1;   // max / mean kernel seconds over the ranks doing attention (see below)
};

// Plans `pieces` (ranks first_rank.. of the layout) with the runner, appending each rank's work.
void plan_group(BalancerRunner& runner, const cad::plan::RankPieces& pieces, const cad_cost_params_v1_t& cost,
                const cad::plan::ModelParams& params, const Layout& layout, int64_t first_rank,
                const AttentionRates& rates, TickPlan& out) {
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

std::vector<BalancerResult> simulate_gpipe(const Scenario& s, const SystemCalibration& cal,
                                           const AttentionRates& rates, const cad_cost_params_v1_t& cost) {
  const int64_t dp = s.layout.dp();
  const int64_t pp = s.layout.pp;
  const int64_t layers = s.shape.layers / pp;
  const cad::plan::ModelParams params = cad::plan::model_params(cost);
  const std::vector<GpipeTick> schedule = gpipe_schedule(pp, s.microbatches);
  const int64_t forward_ticks = static_cast<int64_t>(schedule.size()) / 2;

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
    r.group_size = pool == PipelinePool::kTick ? pp * dp : pool == PipelinePool::kStage ? stage_group : 1;
    r.off.pingpong = false;
    r.on.pingpong = true;
    pools.push_back(pool);
    results.push_back(r);
  }

  const int64_t steps = s.batch_seeds.empty() ? s.steps : static_cast<int64_t>(s.batch_seeds.size()) / s.microbatches;
  const double per_tick = 1.0 / static_cast<double>(steps * forward_ticks);
  const double per_micro_batch = 1.0 / static_cast<double>(steps * s.microbatches);
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<cad::plan::RankPieces> batches;
    for (int64_t m = 0; m < s.microbatches; ++m) {
      const size_t i = static_cast<size_t>(step * s.microbatches + m);
      const uint64_t seed = s.batch_seeds.empty() ? s.seed + i : s.batch_seeds[i];
      batches.push_back(documents_per_rank(cad::workload::sample_batch(s.lengths, s.context, static_cast<int32_t>(dp), seed)));
    }
    for (size_t bi = 0; bi < s.balancers.size(); ++bi) {
      BalancerResult& res = results[bi];
      const PipelinePool pool = pools[bi];
      if (s.progress) {
        s.progress("step " + std::to_string(step + 1) + "/" + std::to_string(steps) + ": " + res.name + " on " +
                   std::to_string(pp) + " stages x " + std::to_string(dp) + " replicas");
      }
      // The plans of the forward ticks; backward tick b reuses forward tick T - 1 - b's.
      std::vector<TickPlan> plans(static_cast<size_t>(forward_ticks));
      for (int64_t t = 0; t < forward_ticks; ++t) {
        const GpipeTick& tick = schedule[static_cast<size_t>(t)];
        TickPlan& plan = plans[static_cast<size_t>(t)];
        auto stage_pieces = [&](int64_t stage) {
          const int64_t m = tick.micro_batch[static_cast<size_t>(stage)];
          return m < 0 ? cad::plan::RankPieces(static_cast<size_t>(dp)) : batches[static_cast<size_t>(m)];
        };
        if (pool == PipelinePool::kTick) {
          // One plan over the union of the stages' documents, every rank a server.
          // The stages run different micro-batches, whose document ids both start at 0: each stage's ids are
          // shifted past the previous stages' so that the plan sees distinct documents.
          cad::plan::RankPieces all;
          int64_t id_offset = 0;
          for (int64_t st = 0; st < pp; ++st) {
            cad::plan::RankPieces p = stage_pieces(st);
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
          plan_group(*runners[bi], all, cost, params, s.layout, 0, rates, plan);
        } else {
          // Each stage on its own, in groups of group_size replicas (1 for local).
          for (int64_t st = 0; st < pp; ++st) {
            if (tick.micro_batch[static_cast<size_t>(st)] < 0) {  // idle: no documents, no plan, no calls
              plan.work.insert(plan.work.end(), static_cast<size_t>(dp), RankWork{});
              continue;
            }
            const cad::plan::RankPieces p = stage_pieces(st);
            for (int64_t begin = 0; begin < dp; begin += res.group_size) {
              const int64_t end = std::min(dp, begin + res.group_size);
              plan_group(*runners[bi], group_pieces(p, begin, end), cost, params, s.layout, st * dp + begin, rates,
                         plan);
            }
          }
        }
        // Over the ranks that do attention in this tick: all of them under tick pooling (idle ones serve), else
        // the ranks running a micro-batch (an idle stage's zeros would only measure the bubble).
        double max_k = 0, sum_k = 0;
        int64_t counted = 0;
        for (const RankWork& w : plan.work) {
          if (w.tokens == 0 && pool != PipelinePool::kTick) continue;
          const double k = w.attention.fwd + w.attention.bwd;
          max_k = std::max(max_k, k);
          sum_k += k;
          ++counted;
        }
        plan.imbalance = sum_k > 0 ? max_k * static_cast<double>(counted) / sum_k : 1.0;
        res.attention_imbalance += per_tick * plan.imbalance;
        res.bytes_per_layer += per_tick * plan.bytes;
        res.plan_ms += per_micro_batch * plan.plan_ms;
      }

      // Local attention couples nothing across replicas: replica r's stages form their own pipeline, which
      // meets the others only at the step's gradient all-reduce. So the step is the slowest replica's sum of
      // ticks. (Under CAD every tick's calls couple every replica of a stage, or of all stages: one sum.)
      std::vector<double> replica_s(static_cast<size_t>(dp), 0.0);
      double step_s = 0;
      for (const GpipeTick& tick : schedule) {
        const int64_t forward_index = tick.backward ? forward_ticks - 1 - tick.index : tick.index;
        const TickPlan& plan = plans[static_cast<size_t>(forward_index)];
        std::vector<TickRankTime> ranks;
        ranks.reserve(plan.work.size());
        for (size_t r = 0; r < plan.work.size(); ++r) {
          const int64_t stage = static_cast<int64_t>(r) / dp;
          const bool runs = tick.micro_batch[static_cast<size_t>(stage)] >= 0;
          // Under tick pooling an idle rank still joins every call (with 0 tokens) and serves.
          const bool joins = runs || pool == PipelinePool::kTick;
          ranks.push_back(tick_rank_time(plan.work[r], tick.backward, joins, pool != PipelinePool::kLocal,
                                         stage == pp - 1, cal, *s.trainer, s.trainer_options));
        }
        const double seconds = tick_seconds(ranks, layers, pool);
        step_s += seconds;
        if (pool == PipelinePool::kLocal) {
          for (int64_t r = 0; r < dp; ++r) {
            std::vector<TickRankTime> replica;
            for (int64_t st = 0; st < pp; ++st) replica.push_back(ranks[static_cast<size_t>(st * dp + r)]);
            replica_s[static_cast<size_t>(r)] += tick_seconds(replica, layers, pool);
          }
        }

        // The parts along the tick's critical path (pipeline_model.h), and each rank's own parts on average,
        // per micro-batch.
        RankTime crit;
        if (pool == PipelinePool::kTick) {
          double na = 0, at = 0, head = 0;
          for (const TickRankTime& r : ranks) {
            na = std::max(na, r.non_attention);
            at = std::max(at, r.attention);
            head = std::max(head, r.head);
          }
          crit.linear = static_cast<double>(layers) * na + head;
          crit.attention = static_cast<double>(layers) * at;
          crit.comm = seconds - crit.linear - crit.attention;
        } else {
          const auto slowest = std::max_element(ranks.begin(), ranks.end(), [&](const TickRankTime& a, const TickRankTime& b) {
            return static_cast<double>(layers) * a.total + a.head < static_cast<double>(layers) * b.total + b.head;
          });
          crit.linear = static_cast<double>(layers) * slowest->non_attention + slowest->head;
          crit.attention = static_cast<double>(layers) * slowest->attention;
          crit.comm = static_cast<double>(layers) * slowest->exchange;
        }
        crit.comm_exposed = crit.comm;
        crit.total = seconds;
        for (ModeResult* mr : {&res.off, &res.on}) {
          mr->slowest.linear += per_micro_batch * crit.linear;
          mr->slowest.attention += per_micro_batch * crit.attention;
          mr->slowest.comm += per_micro_batch * crit.comm;
          mr->slowest.comm_exposed += per_micro_batch * crit.comm_exposed;
          mr->slowest.total += per_micro_batch * crit.total;
          const double per_rank = per_micro_batch / static_cast<double>(ranks.size());
          for (const TickRankTime& r : ranks) {
            const double l = static_cast<double>(layers);
            mr->mean.linear += per_rank * (l * r.non_attention + r.head);
            mr->mean.attention += per_rank * l * r.attention;
            mr->mean.comm += per_rank * l * r.exchange;
            mr->mean.comm_exposed += per_rank * l * r.exchange;
            mr->mean.total += per_rank * (l * r.total + r.head);
          }
        }
        if (s.detail) {
          TickDetail d;
          d.step = step;
          d.tick = tick;
          d.ranks = std::move(ranks);
          d.seconds = seconds;
          d.plan_documents = plan.documents;
          res.ticks.push_back(std::move(d));
        }
      }
      if (pool == PipelinePool::kLocal) step_s = *std::max_element(replica_s.begin(), replica_s.end());
      step_s += s.trainer->step_fixed_ms * 1e-3;
      // Ping-pong is not modelled for this schedule: "on" is priced as "off".
      res.off.step_seconds.push_back(step_s);
      res.on.step_seconds.push_back(step_s);
    }
  }
  set_mean_step_seconds(results);
  return results;
}

}  // namespace cad::simulate
