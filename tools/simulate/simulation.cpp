// simulation.cpp -- the `cad simulate` driver (see simulation.h).
#include "simulation.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#include "balancer_runner.h"
#include "batch_recipe.h"
#include "long_docs.h"
#include "one_f_one_b_simulation.h"
#include "pipeline_simulation.h"
#include "plan_work.h"
#include "server_memory.h"
#include "tensor_slices.h"

namespace cad::simulate {

namespace {

void add(RankTime& into, const RankTime& t, double weight) {
  into.linear += weight * t.linear;
  into.attention += weight * t.attention;
  into.comm += weight * t.comm;
  into.comm_exposed += weight * t.comm_exposed;
  into.tp_comm += weight * t.tp_comm;
  into.plan += weight * t.plan;
  into.total += weight * t.total;
}

RankTime as_rank_time(const TrainerRankTime& t) {
  RankTime r;
  r.linear = t.linear;
  r.attention = t.attention;
  r.comm = t.exchange;
  r.comm_exposed = t.exchange_exposed;
  r.plan = t.plan;
  r.total = t.total;
  return r;
}

void check_scenario(const Scenario& s, const AttentionRates& rates) {
  validate(s.shape);
  validate(s.layout, s.shape);
  if (s.context < 1) throw std::invalid_argument("--context must be >= 1");
  if (s.lengths.empty()) throw std::invalid_argument("the document-length list is empty");
  if (s.balancers.empty()) throw std::invalid_argument("--balancers names no balancer");
  if (s.steps < 1) throw std::invalid_argument("--steps must be >= 1");
  if (s.microbatches < 1) throw std::invalid_argument("--microbatches must be >= 1");
  if (!s.batch_seeds.empty() && s.batch_seeds.size() % static_cast<size_t>(s.microbatches) != 0) {
    throw std::invalid_argument("--batch-seeds: " + std::to_string(s.batch_seeds.size()) +
                                " seeds is not a whole number of steps of --microbatches " +
                                std::to_string(s.microbatches));
  }
  if (is_trainer_pipeline(s.schedule)) {
    const std::string schedule = std::string("--schedule ") + schedule_name(s.schedule);
    if (s.layout.pp < 2) {
      throw std::invalid_argument(schedule + " needs --pp >= 2 (pipeline stages), got --pp " +
                                  std::to_string(s.layout.pp));
    }
    if (s.trainer == nullptr) {
      throw std::invalid_argument(schedule + " prices the pipeline trainer's ticks with the trainer calibration; "
                                  "it needs --trainer FILE");
    }
    if (s.pool == PipelinePool::kLocal) {
      throw std::invalid_argument("--pool: expected tick, stage, bubble or bubble_stage (local attention is the "
                                  "colocated balancer)");
    }
    // 1F1B --pool bubble: a micro-batch's forward and backward on a stage can fall one in a pooled tick and the
    // other in a local one; only full checkpointing (the backward recomputing its forward under its own tick's
    // attention) makes them independent. The trainer refuses it otherwise too (train_pipeline.py --pool bubble).
    if (s.pool == PipelinePool::kBubble && s.schedule == Schedule::k1f1bTicks && !s.trainer_options.checkpointing) {
      throw std::invalid_argument(kBubble1f1bNeedsCheckpointing);
    }
    if (s.pool == PipelinePool::kBubbleStage && s.schedule != Schedule::kGpipe) {
      throw std::invalid_argument(kBubbleStageNeedsGpipe);
    }
    for (const auto& b : s.balancers) {
      if (b.plan_is_layout) {
        throw std::invalid_argument(schedule + ": balancer '" + b.name +
                                    "' (its plan is the token layout) is not modelled for the pipeline; "
                                    "name --balancers without it");
      }
    }
  } else if (s.trainer != nullptr && s.layout.pp != 1) {
    throw std::invalid_argument("--trainer models a data-parallel trainer (FSDP2); it cannot go with --pp " +
                                std::to_string(s.layout.pp) + " and the kernel-level 1F1B schedule (--schedule "
                                "gpipe or 1f1b_ticks: the pipeline trainer)");
  }
  if (!(s.trainer_options.kernel_scale > 0)) throw std::invalid_argument("the attention kernel scale must be > 0");
  if (rates.head_dim() != 0 && rates.head_dim() != s.shape.head_dim) {
    throw std::invalid_argument("the attention rate table (" + rates.describe() + ") holds for head_dim " +
                                std::to_string(rates.head_dim()) + ", the model has head_dim " +
                                std::to_string(s.shape.head_dim));
  }
  for (const auto& b : s.balancers) {
    if (b.group_size < 0) throw std::invalid_argument("balancer '" + b.name + "': group size must be >= 0");
  }
  if (s.max_doc_len < 0) throw std::invalid_argument("--max-doc-len must be >= 1");
  if (s.max_doc_len > 0) {
    const int64_t dp = s.layout.dp();
    const int64_t g = s.document_group;
    if (is_trainer_pipeline(s.schedule) || s.layout.pp > 1) {
      throw std::invalid_argument("--max-doc-len: long documents are modelled without pipeline stages (--pp 1)");
    }
    if (g < 1 || dp % g != 0) {
      throw std::invalid_argument("--max-doc-len: the document group (--cp-size " + std::to_string(g) +
                                  ") must divide the " + std::to_string(dp) + " data-parallel ranks");
    }
    // A document longer than a group would be cut at its edge: its attention would not be the document's.
    if (s.max_doc_len > g * s.context) {
      throw std::invalid_argument("--max-doc-len " + std::to_string(s.max_doc_len) + " is more than a group of --cp-size " +
                                  std::to_string(g) + " ranks x --tokens-per-rank " + std::to_string(s.context) +
                                  " holds; raise --cp-size to at least " +
                                  std::to_string((s.max_doc_len + s.context - 1) / s.context));
    }
    for (const auto& b : s.balancers) {
      const int64_t size = b.group_size == 0 ? dp : std::min(b.group_size, dp);
      if (size % g != 0) {
        throw std::invalid_argument("--max-doc-len: balancer '" + b.name + "' plans groups of " + std::to_string(size) +
                                    " ranks, not a multiple of the document group (--cp-size " + std::to_string(g) +
                                    "): it would cut documents the others keep whole");
      }
    }
  }
}

}  // namespace

const char* schedule_name(Schedule schedule) {
  switch (schedule) {
    case Schedule::kGpipe:
      return "gpipe";
    case Schedule::k1f1bTicks:
      return "1f1b_ticks";
    case Schedule::k1f1b:
      break;
  }
  return "1f1b";
}

bool is_trainer_pipeline(Schedule schedule) {
  return schedule == Schedule::kGpipe || schedule == Schedule::k1f1bTicks;
}

cad::plan::RankPieces scenario_batch(const Scenario& s, int32_t ranks, uint64_t seed, int64_t* cut_documents) {
  if (cut_documents != nullptr) *cut_documents = 0;
  if (s.max_doc_len == 0) return documents_per_rank(cad::workload::sample_batch(s.lengths, s.context, ranks, seed));
  return documents_within_groups(cad::workload::sample_long_batch(s.lengths, s.max_doc_len, s.context, ranks, seed),
                                 s.document_group, cut_documents);
}

std::vector<BalancerResult> simulate(const Scenario& s, const SystemCalibration& cal, const AttentionRates& rates,
                                     BatchSummary* summary) {
  check_scenario(s, rates);
  const int64_t dp = s.layout.dp();

  // Every TP index plans its data group on its own head slice; the slices' costs are alike, so one plan
  // (TP index 0's) is every index's plan, and one index's bytes and seconds are every GPU's.
  const cad_cost_params_v1_t cost = slice_cost(s.layout, s.shape, 0, s.min_shard_tokens);
  for (int64_t i = 1; i < s.layout.tp; ++i) {
    if (!same_cost(cost, slice_cost(s.layout, s.shape, i, s.min_shard_tokens))) {
      throw std::logic_error("TP index " + std::to_string(i) + " would plan with another cost than index 0");
    }
  }
  const cad::plan::ModelParams params = cad::plan::model_params(cost);

  if (s.schedule == Schedule::kGpipe) return simulate_gpipe(s, cal, rates, cost);
  if (s.schedule == Schedule::k1f1bTicks) return simulate_1f1b_ticks(s, cal, rates, cost);

  std::vector<std::unique_ptr<BalancerRunner>> runners;
  std::vector<BalancerResult> results;
  for (const auto& b : s.balancers) {
    runners.push_back(std::make_unique<BalancerRunner>(b.name, b.config, s.search_path));
    BalancerResult r;
    r.name = runners.back()->name();
    r.group_size = b.group_size == 0 ? dp : std::min(b.group_size, dp);
    r.off.pingpong = false;
    r.on.pingpong = true;
    results.push_back(r);
  }

  const int64_t steps = s.batch_seeds.empty() ? s.steps : static_cast<int64_t>(s.batch_seeds.size()) / s.microbatches;
  const int64_t batches = steps * s.microbatches;
  const double weight = 1.0 / static_cast<double>(batches);
  if (summary != nullptr) *summary = BatchSummary{};
  // times[balancer][mode][microbatch of this step][rank]
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<std::vector<std::vector<std::vector<double>>>> times(
        s.balancers.size(), std::vector<std::vector<std::vector<double>>>(2));
    for (int64_t m = 0; m < s.microbatches; ++m) {
      const uint64_t seed = s.batch_seeds.empty() ? s.seed + static_cast<uint64_t>(step * s.microbatches + m)
                                                  : s.batch_seeds[static_cast<size_t>(step * s.microbatches + m)];
      int64_t cut = 0;
      const cad::plan::RankPieces batch = scenario_batch(s, static_cast<int32_t>(dp), seed, &cut);
      if (summary != nullptr) {
        const cad::workload::LayoutSummary ls = cad::workload::summarize(batch);
        summary->documents += weight * static_cast<double>(ls.documents);
        summary->cut_documents += weight * static_cast<double>(cut);
        summary->widest_span = std::max<int64_t>(summary->widest_span, ls.widest_span);
        summary->longest = std::max(summary->longest, ls.longest);
      }
      for (size_t bi = 0; bi < s.balancers.size(); ++bi) {
        const BalancerSpec& spec = s.balancers[bi];
        BalancerResult& res = results[bi];
        if (s.progress) {
          s.progress("step " + std::to_string(step + 1) + "/" + std::to_string(steps) + ", micro-batch " +
                     std::to_string(m + 1) + "/" + std::to_string(s.microbatches) + ": " + res.name + " on " +
                     std::to_string(dp) + " ranks in groups of " + std::to_string(res.group_size));
        }
        std::vector<RankWork> work;
        work.reserve(static_cast<size_t>(dp));
        std::vector<int64_t> group_tasks;  // per rank: the tasks it serves in its group's plan
        group_tasks.reserve(static_cast<size_t>(dp));
        int64_t all_tasks = 0;
        double bytes = 0, plan_ms = 0;
        std::vector<int64_t> kv_bytes, memory_received;  // per rank, as a server
        int64_t max_kv_rows = 0;
        for (int64_t begin = 0; begin < dp; begin += res.group_size) {
          const int64_t end = std::min(dp, begin + res.group_size);
          cad::plan::RankPieces pieces = group_pieces(batch, begin, end);
          const auto start = std::chrono::steady_clock::now();
          std::vector<cad_task_v1_t> tasks = runners[bi]->plan(pieces, cost);
          plan_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
          if (spec.plan_is_layout) pieces = context_parallel_layout(pieces, tasks, static_cast<int32_t>(end - begin));
          double group_bytes = 0;
          std::vector<RankWork> w = rank_work(pieces, tasks, params, s.layout, begin, rates, &group_bytes);
          bytes += group_bytes;
          work.insert(work.end(), w.begin(), w.end());
          const cad::workload::ServerMemory mem = cad::workload::server_memory(
              pieces, static_cast<int32_t>(end - begin), tasks.data(), static_cast<int64_t>(tasks.size()), params);
          kv_bytes.insert(kv_bytes.end(), mem.kv_bytes.begin(), mem.kv_bytes.end());
          memory_received.insert(memory_received.end(), mem.foreign_bytes.begin(), mem.foreign_bytes.end());
          for (const int64_t rows : mem.kv_rows) max_kv_rows = std::max(max_kv_rows, rows);
          // The tasks each rank serves: its share of the plan make's device tables (trainer_model.h).
          std::vector<int64_t> served(w.size(), 0);
          for (const cad_task_v1_t& t : tasks) {
            if (t.server >= 0 && static_cast<size_t>(t.server) < served.size()) ++served[static_cast<size_t>(t.server)];
          }
          group_tasks.insert(group_tasks.end(), served.begin(), served.end());
          all_tasks += static_cast<int64_t>(tasks.size());
        }
        res.plan_ms += weight * plan_ms;
        res.bytes_per_layer += weight * bytes;
        double intra = 0, inter = 0, max_inter = 0;
        for (const RankWork& w : work) {
          intra += w.bytes.sent_intra;
          inter += w.bytes.sent_inter;
          max_inter = std::max(max_inter, w.bytes.sent_inter);
        }
        res.bytes_intra_per_layer += weight * intra;
        res.bytes_inter_per_layer += weight * inter;
        res.max_inter_sent_per_gpu += weight * max_inter;
        res.max_kv_rows = std::max(res.max_kv_rows, max_kv_rows);
        for (size_t r = 0; r < kv_bytes.size(); ++r) {
          res.max_kv_bytes = std::max(res.max_kv_bytes, kv_bytes[r]);
          res.max_memory_received = std::max(res.max_memory_received, memory_received[r]);
        }
        double max_attn = 0, sum_attn = 0;
        for (const RankWork& w : work) {
          const double a = w.attention.fwd + w.attention.bwd;
          max_attn = std::max(max_attn, a);
          sum_attn += a;
        }
        res.attention_imbalance += weight * (sum_attn > 0 ? max_attn * static_cast<double>(dp) / sum_attn : 1.0);
        // Colocated ranks keep their documents: no plan to make, nothing to exchange -- unless documents span
        // ranks (long documents), where colocated over pieces gathers the earlier pieces' K/V.
        const bool moves_work = res.group_size > 1 && (res.name != "colocated" || bytes > 0);
        MicroBatchDetail detail;
        if (s.detail) {
          detail.step = step;
          detail.micro_batch = m;
          detail.seed = seed;
          detail.tasks = all_tasks;
          detail.ranks.resize(work.size());
        }
        for (int mode = 0; mode < 2; ++mode) {
          ModeResult& mr = mode == 0 ? res.off : res.on;
          const bool pingpong = mode == 1;
          auto price = [&](size_t r) {
            if (s.trainer == nullptr) return rank_time(work[r], s.shape, s.layout, cal, pingpong);
            const TrainerRankTime tt = trainer_rank_time(work[r], moves_work, group_tasks[r], s.shape, s.layout, cal,
                                                         *s.trainer, s.trainer_options, pingpong);
            if (s.detail) (pingpong ? detail.ranks[r].trainer_on : detail.ranks[r].trainer_off) = tt;
            return as_rank_time(tt);
          };
          std::vector<double> t(static_cast<size_t>(dp));
          size_t slowest = 0;
          for (size_t r = 0; r < work.size(); ++r) {
            const RankTime rt = price(r);
            t[r] = rt.total;
            if (rt.total > t[slowest]) slowest = r;
            add(mr.mean, rt, weight / static_cast<double>(dp));
            if (s.detail) {
              RankDetail& d = detail.ranks[r];
              d.tokens = work[r].tokens;
              d.tasks_served = group_tasks[r];
              d.attention_fwd_s = work[r].attention.fwd;
              d.attention_bwd_s = work[r].attention.bwd;
              d.bytes_sent = work[r].bytes.sent_intra + work[r].bytes.sent_inter;
              d.bytes_received = work[r].bytes.received_intra + work[r].bytes.received_inter;
              d.bytes_sent_inter = work[r].bytes.sent_inter;
              d.kv_bytes = kv_bytes[r];
              d.memory_received = memory_received[r];
              (pingpong ? d.total_on_s : d.total_off_s) = rt.total;
            }
          }
          add(mr.slowest, price(slowest), weight);
          times[bi][static_cast<size_t>(mode)].push_back(std::move(t));
        }
        if (s.detail) res.detail.push_back(std::move(detail));
      }
    }
    for (size_t bi = 0; bi < s.balancers.size(); ++bi) {
      for (int mode = 0; mode < 2; ++mode) {
        ModeResult& mr = mode == 0 ? results[bi].off : results[bi].on;
        const auto& t = times[bi][static_cast<size_t>(mode)];
        // A trainer's FSDP2 meets at every layer: every micro-batch waits for the slowest rank of all.
        mr.step_seconds.push_back(s.trainer != nullptr ? trainer_step_seconds(t, *s.trainer)
                                                       : step_seconds(t, results[bi].group_size, s.layout.pp));
      }
    }
  }
  set_mean_step_seconds(results);
  return results;
}

void set_mean_step_seconds(std::vector<BalancerResult>& results) {
  for (auto& r : results) {
    for (ModeResult* mr : {&r.off, &r.on}) {
      mr->mean_step_seconds = std::accumulate(mr->step_seconds.begin(), mr->step_seconds.end(), 0.0) /
                              static_cast<double>(mr->step_seconds.size());
    }
  }
}

}  // namespace cad::simulate
