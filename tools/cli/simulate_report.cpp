// simulate_report.cpp -- `cad simulate`'s output: the model's results as JSON (per rank, per micro-batch, per
// pipeline tick) and the text lines that name the network and the tensor-parallel layout it priced.
#include "simulate_report.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_rates.h"
#include "tensor_slices.h"
#include "trainer_calibration.h"

namespace cad::cli::simulate_report {

namespace sim = cad::simulate;

// The model's results must be finite numbers: a calibration file can still hold rates that make a
// time overflow, and JSON would print it as null.
void require_finite(const std::vector<sim::BalancerResult>& results) {
  for (const auto& r : results) {
    for (const sim::ModeResult* m : {&r.off, &r.on}) {
      const double values[] = {m->mean_step_seconds, m->slowest.total, m->mean.total, r.attention_imbalance};
      for (const double v : values) {
        if (!std::isfinite(v)) {
          throw std::runtime_error("balancer '" + r.name + "': the model's step time is not a finite number (" +
                                   std::to_string(v) + "); check the calibration rates");
        }
      }
    }
  }
}

namespace {

nlohmann::json rank_time_json(const sim::RankTime& t) {
  return {{"linear_s", t.linear},       {"attention_s", t.attention}, {"comm_s", t.comm},
          {"comm_exposed_s", t.comm_exposed}, {"tp_comm_s", t.tp_comm}, {"plan_s", t.plan},
          {"total_s", t.total}};
}

nlohmann::json trainer_time_json(const sim::TrainerRankTime& t) {
  return {{"linear_s", t.linear},     {"attention_s", t.attention}, {"exchange_s", t.exchange},
          {"exchange_exposed_s", t.exchange_exposed}, {"plan_s", t.plan}, {"total_s", t.total}};
}

}  // namespace

nlohmann::json detail_json(const std::vector<sim::MicroBatchDetail>& detail) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : detail) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& r : m.ranks) {
      ranks.push_back({{"tokens", r.tokens},
                       {"tasks_served", r.tasks_served},
                       {"attention_fwd_s", r.attention_fwd_s},
                       {"attention_bwd_s", r.attention_bwd_s},
                       {"bytes_sent", r.bytes_sent},
                       {"bytes_received", r.bytes_received},
                       {"bytes_sent_inter_node", r.bytes_sent_inter},
                       {"kv_bytes", r.kv_bytes},
                       {"memory_received", r.memory_received},
                       {"total_off_s", r.total_off_s},
                       {"total_on_s", r.total_on_s},
                       {"trainer_off", trainer_time_json(r.trainer_off)},
                       {"trainer_on", trainer_time_json(r.trainer_on)}});
    }
    out.push_back({{"step", m.step}, {"micro_batch", m.micro_batch}, {"seed", m.seed}, {"tasks", m.tasks},
                   {"ranks", ranks}});
  }
  return out;
}

const char* pool_name(sim::PipelinePool pool) {
  switch (pool) {
    case sim::PipelinePool::kTick:
      return "tick";
    case sim::PipelinePool::kStage:
      return "stage";
    case sim::PipelinePool::kBubble:
      return "bubble";
    case sim::PipelinePool::kBubbleStage:
      return "bubble_stage";
    case sim::PipelinePool::kLocal:
      break;
  }
  return "local";
}

nlohmann::json ticks_json(const std::vector<sim::TickDetail>& ticks) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& t : ticks) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& r : t.ranks) {
      ranks.push_back({{"tokens", r.tokens}, {"non_attention_per_layer_s", r.non_attention},
                       {"attention_per_layer_s", r.attention}, {"exchange_per_layer_s", r.exchange},
                       {"head_s", r.head}});
    }
    // GPipe: one phase for the tick; 1F1B: each stage's own ("idle" where it runs nothing).
    nlohmann::json phase = t.tick.backward ? "backward" : "forward";
    if (!t.ops.empty()) {
      phase = nlohmann::json::array();
      for (const sim::StageOp& op : t.ops) {
        phase.push_back(op.micro_batch < 0 ? "idle" : op.backward ? "backward" : "forward");
      }
    }
    nlohmann::json tick = {{"step", t.step},         {"phase", phase},
                           {"tick", t.tick.index},   {"micro_batch", t.tick.micro_batch},
                           {"seconds", t.seconds},   {"plan_documents", t.plan_documents},
                           {"ranks", ranks},         {"pool", pool_name(t.pool)}};
    // 1F1B without tick pooling: the stages are not in lockstep, so each rank's own clock after the tick.
    if (!t.rank_ends.empty()) tick["rank_end_s"] = t.rank_ends;
    out.push_back(tick);
  }
  return out;
}

nlohmann::json mode_json(const sim::ModeResult& m) {
  return {{"pingpong", m.pingpong},
          {"step_seconds", m.step_seconds},
          {"mean_step_seconds", m.mean_step_seconds},
          {"slowest_rank", rank_time_json(m.slowest)},
          {"mean_rank", rank_time_json(m.mean)}};
}

const sim::BalancerResult* find(const std::vector<sim::BalancerResult>& results, const std::string& name) {
  for (const auto& r : results)
    if (r.name == name) return &r;
  return nullptr;
}

double speedup(const sim::BalancerResult* base, const sim::BalancerResult& r, bool pingpong) {
  if (base == nullptr) return 0;
  const sim::ModeResult& b = pingpong ? base->on : base->off;
  const sim::ModeResult& m = pingpong ? r.on : r.off;
  return m.mean_step_seconds > 0 ? b.mean_step_seconds / m.mean_step_seconds : 0;
}

nlohmann::json network_json(const sim::SystemCalibration& cal) {
  nlohmann::json n = {{"GBps_per_gpu", cal.net_GBps_per_gpu}, {"efficiency", cal.net_efficiency},
                      {"latency_us", cal.net_latency_us},     {"source", cal.net_source},
                      {"overlap", cal.overlap},               {"overlap_source", cal.overlap_source}};
  if (!cal.net_curve.empty()) {
    nlohmann::json points = nlohmann::json::array();
    for (const sim::LinkPoint& p : cal.net_curve) points.push_back({{"bytes", p.bytes}, {"seconds", p.seconds}});
    n["curve"] = points;
  }
  return n;
}

std::string network_line(const sim::SystemCalibration& cal) {
  char text[512];
  if (cal.net_curve.empty()) {
    std::snprintf(text, sizeof text, "network between nodes: %.1f GB/s per GPU x %.2f, %.0f us per exchange (%s)",
                  cal.net_GBps_per_gpu, cal.net_efficiency, cal.net_latency_us, cal.net_source.c_str());
  } else {
    std::snprintf(text, sizeof text, "network between nodes: a fitted curve of %zu points (%s)", cal.net_curve.size(),
                  cal.net_source.c_str());
  }
  return std::string(text) + "\nping-pong (on) hides " + std::to_string(cal.overlap).substr(0, 4) +
         " of each pass's exchange, at most its compute (" + cal.overlap_source + ")";
}

nlohmann::json tensor_parallel_json(const sim::Scenario& s) {
  const sim::HeadSlice h = sim::head_slice(s.layout, s.shape, 0);
  return {{"tp", s.layout.tp},
          {"q_heads_per_gpu", h.q_heads},
          {"kv_heads_per_gpu", h.kv_heads},
          {"kv_replicated", h.kv_replicated},
          {"cad_groups", s.layout.tp},
          {"plan", "one per data group and micro-batch, the same on every TP index"},
          {"bytes", "per GPU: each TP index exchanges its own head slice with the same TP index of the other "
                    "data-parallel ranks"}};
}

std::string tensor_parallel_line(const sim::Scenario& s) {
  if (s.layout.tp == 1) return "tensor parallelism: none (every GPU is a data-parallel rank holding all heads)";
  const sim::HeadSlice h = sim::head_slice(s.layout, s.shape, 0);
  return "tensor parallelism: " + std::to_string(s.layout.tp) + " TP indices, each CAD over its " +
         std::to_string(s.layout.dp()) + " data-parallel ranks on " + std::to_string(h.q_heads) + " query / " +
         std::to_string(h.kv_heads) + (h.kv_replicated ? " (replicated)" : "") +
         " KV heads, the same plan on every index; bytes and times are one GPU's";
}

// ---- the whole report -----------------------------------------------------------------------------------------

nlohmann::json report_json(const SimulateRun& run) {
  const sim::Scenario& s = run.scenario;
  const sim::BalancerResult* colocated = find(run.results, "colocated");
  const sim::BalancerResult* per_doc_cp = find(run.results, "per_doc_cp");
  nlohmann::json out;
  out["model"] = {{"name", s.shape.name},       {"layers", s.shape.layers},   {"hidden", s.shape.hidden},
                  {"heads", s.shape.heads},     {"kv_heads", s.shape.kv_heads}, {"head_dim", s.shape.head_dim},
                  {"mlp", s.shape.mlp},         {"vocab", s.shape.vocab}};
  out["layout"] = {{"gpus", s.layout.gpus}, {"gpus_per_node", s.layout.gpus_per_node}, {"tp", s.layout.tp},
                   {"pp", s.layout.pp},     {"dp", s.layout.dp()}, {"schedule", run.schedule},
                  {"ranks_per_node", run.ranks_per_node()}, {"nic_share", s.layout.rail_routed ? "node" : "gpu"}};
  out["tensor_parallel"] = tensor_parallel_json(s);
  out["network"] = network_json(run.cal);
  if (run.trainer_pipeline()) out["layout"]["pool"] = pool_name(s.pool);
  out["workload"] = {{"dist", run.dist},   {"context", s.context}, {"steps", s.steps}, {"seed", s.seed},
                     {"microbatches", s.microbatches}, {"min_shard", s.min_shard_tokens},
                     {"balance_time", run.balance_time}};
  if (run.has_tolerance) out["workload"]["tolerance"] = run.tolerance;
  if (run.long_docs()) {
    out["workload"]["max_doc_len"] = s.max_doc_len;
    out["workload"]["tokens_per_rank"] = s.context;
    out["workload"]["document_group"] = s.document_group;
  }
  out["workload"]["documents_per_micro_batch"] = run.summary.documents;
  out["workload"]["documents_cut_at_group_edges"] = run.summary.cut_documents;
  out["workload"]["widest_span_ranks"] = run.summary.widest_span;
  out["workload"]["longest_document"] = run.summary.longest;
  out["calibration"] = {{"rates", run.rates.describe()},
                        {"system", run.cal.path},
                        {"gemm_tflops", run.cal.gemm_tflops},
                        {"net_GBps_per_gpu", run.cal.net_GBps_per_gpu},
                        {"net_efficiency", run.cal.net_efficiency}};
  if (run.trainer) {
    out["trainer"] = {{"file", run.trainer->path},
                      {"fitted_on", run.trainer->fitted_on},
                      {"checkpointing", s.trainer_options.checkpointing ? "full" : "none"},
                      {"kernel_scale", s.trainer_options.kernel_scale},
                      {"layer_us_per_token", run.trainer->layer_us_per_token},
                      {"head_us_per_token", run.trainer->head_us_per_token},
                      {"step_fixed_ms", run.trainer->step_fixed_ms},
                      {"plan_make_ms", run.trainer->plan_make_ms},
                      {"plan_make_us_per_task", run.trainer->plan_make_us_per_task},
                      {"plan_make_ns_per_token", run.trainer->plan_make_ns_per_token},
                      {"attention_call_us", run.trainer->attention_call_us},
                      {"exchange_fixed_us", run.trainer->exchange_fixed_us},
                      {"pack_unpack_ns_per_byte", run.trainer->pack_unpack_ns_per_byte},
                      {"pingpong_compute_factor", run.trainer->pingpong_compute_factor}};
  }
  if (!s.batch_seeds.empty()) out["workload"]["batch_seeds"] = s.batch_seeds;
  out["balancers"] = nlohmann::json::array();
  for (const auto& r : run.results) {
    nlohmann::json b = {{"name", r.name},
                        {"group_size", r.group_size},
                        {"attention_imbalance", r.attention_imbalance},
                        {"bytes_per_layer", r.bytes_per_layer},
                        {"bytes_intra_node_per_layer", r.bytes_intra_per_layer},
                        {"bytes_inter_node_per_layer", r.bytes_inter_per_layer},
                        {"max_inter_node_sent_per_gpu", r.max_inter_sent_per_gpu},
                        {"memory", {{"max_kv_rows", r.max_kv_rows},
                                    {"max_kv_bytes", r.max_kv_bytes},
                                    {"max_memory_received", r.max_memory_received}}},
                        {"plan_ms", r.plan_ms},
                        {"off", mode_json(r.off)},
                        {"on", mode_json(r.on)}};
    if (s.detail && !run.trainer_pipeline()) b["detail"] = detail_json(r.detail);
    if (s.detail && run.trainer_pipeline()) b["ticks"] = ticks_json(r.ticks);
    for (const bool pp : {false, true}) {
      const std::string mode = pp ? "on" : "off";
      if (colocated != nullptr) b[mode]["speedup_vs_colocated"] = speedup(colocated, r, pp);
      if (per_doc_cp != nullptr) b[mode]["speedup_vs_per_doc_cp"] = speedup(per_doc_cp, r, pp);
    }
    out["balancers"].push_back(b);
  }
  out["wall_seconds"] = run.wall_seconds;
  return out;
}

void print_report(const SimulateRun& run) {
  const sim::Scenario& s = run.scenario;
  const sim::BalancerResult* colocated = find(run.results, "colocated");
  const sim::BalancerResult* per_doc_cp = find(run.results, "per_doc_cp");

  std::printf("cad simulate: %s (L=%lld H=%lld Hq=%lld Hkv=%lld D=%lld mlp=%lld) on %lld GPUs (%lld per node), "
              "tp=%lld pp=%lld dp=%lld\n",
              s.shape.name.c_str(), static_cast<long long>(s.shape.layers), static_cast<long long>(s.shape.hidden),
              static_cast<long long>(s.shape.heads), static_cast<long long>(s.shape.kv_heads),
              static_cast<long long>(s.shape.head_dim), static_cast<long long>(s.shape.mlp),
              static_cast<long long>(s.layout.gpus), static_cast<long long>(s.layout.gpus_per_node),
              static_cast<long long>(s.layout.tp), static_cast<long long>(s.layout.pp),
              static_cast<long long>(s.layout.dp()));
  std::printf("workload: %s, %lld tokens per data-parallel rank, %lld step(s) x %lld micro-batch(es), seed %llu\n",
              run.dist.c_str(), static_cast<long long>(s.context), static_cast<long long>(s.steps),
              static_cast<long long>(s.microbatches), static_cast<unsigned long long>(s.seed));
  if (run.has_tolerance) std::printf("balancer tolerance: %g (distca, prefix_aware)\n", run.tolerance);
  if (run.long_docs()) {
    std::printf("long documents: up to %lld tokens, laid whole over the ranks in groups of %lld (%.1f documents per "
                "micro-batch, %.1f cut at group edges, widest over %lld ranks)\n",
                static_cast<long long>(s.max_doc_len), static_cast<long long>(s.document_group), run.summary.documents,
                run.summary.cut_documents, static_cast<long long>(run.summary.widest_span));
  }
  std::printf("attention rates: %s\nsystem: %s (GEMM %.0f TFLOP/s)\n", run.rates.describe().c_str(), run.cal.path.c_str(),
              run.cal.gemm_tflops);
  std::printf("%s\n%s\n", network_line(run.cal).c_str(), tensor_parallel_line(s).c_str());
  if (s.layout.rail_routed) {
    std::printf("cross-node bytes rail-routed (--nic-share node): each NIC carries what its node sends to its rail\n");
  }
  if (run.trainer) {
    std::printf("trainer: %s (fitted on %s), checkpointing %s, attention kernel x %.3f; linear_s includes the\n"
                "trainer's non-attention time, comm_s CAD's exchanges with their fixed and pack/unpack costs\n",
                run.trainer->path.c_str(), run.trainer->fitted_on.c_str(), s.trainer_options.checkpointing ? "full" : "none",
                s.trainer_options.kernel_scale);
  }
  if (run.trainer_pipeline()) {
    std::printf("schedule: %s, %lld ticks per step (2 x (%lld micro-batches + %lld stages - 1)), CAD pooled per "
                "%s; ping-pong not modelled (on = off); linear/attn/comm: along each tick's critical path\n",
                run.schedule.c_str(), static_cast<long long>(2 * (s.microbatches + s.layout.pp - 1)),
                static_cast<long long>(s.microbatches), static_cast<long long>(s.layout.pp),
                s.pool == sim::PipelinePool::kBubble        ? "tick in the bubble ticks (some stage idle), local in the others"
                : s.pool == sim::PipelinePool::kBubbleStage ? "tick in the bubble ticks (some stage idle), stage in the others"
                                                            : pool_name(s.pool));
  }
  std::printf("\n");
  for (const bool pp : {false, true}) {
    if ((pp && run.pingpong == "off") || (!pp && run.pingpong == "on")) continue;
    std::printf("ping-pong %s\n", pp ? "on" : "off");
    std::printf("%-14s %6s %9s %10s %9s %9s %9s %9s %9s %8s %8s\n", "balancer", "group", "attn_imb", "GiB/layer",
                "step_s", "linear_s", "attn_s", "comm_s", "exposed_s", "vs_coloc", "vs_cp");
    for (const auto& r : run.results) {
      const sim::ModeResult& m = pp ? r.on : r.off;
      std::printf("%-14s %6lld %9.3f %10.3f %9.3f %9.3f %9.3f %9.3f %9.3f %8.3f %8.3f\n", r.name.c_str(),
                  static_cast<long long>(r.group_size), r.attention_imbalance,
                  r.bytes_per_layer / (1024.0 * 1024.0 * 1024.0), m.mean_step_seconds, m.slowest.linear,
                  m.slowest.attention, m.slowest.comm, m.slowest.comm_exposed, speedup(colocated, r, pp),
                  speedup(per_doc_cp, r, pp));
    }
    std::printf("\n");
  }
  std::printf("(linear/attn/comm/exposed: the slowest rank of each micro-batch, seconds per micro-batch; "
              "simulated in %.2f s)\n\n", run.wall_seconds);
  // One GPU's (one TP index's) exchanges per layer and pass, and the memory its server role needs.
  std::printf("bytes per layer (all ranks of one TP index) by node (%lld ranks per node), and memory per server:\n",
              static_cast<long long>(run.ranks_per_node()));
  std::printf("%-14s %11s %11s %16s %11s %13s\n", "balancer", "intra_GiB", "inter_GiB", "max_inter_GiB/GPU",
              "max_kv_GiB", "max_recv_GiB");
  const double gib = 1024.0 * 1024.0 * 1024.0;
  for (const auto& r : run.results) {
    std::printf("%-14s %11.3f %11.3f %16.3f %11.3f %13.3f\n", r.name.c_str(), r.bytes_intra_per_layer / gib,
                r.bytes_inter_per_layer / gib, r.max_inter_sent_per_gpu / gib, static_cast<double>(r.max_kv_bytes) / gib,
                static_cast<double>(r.max_memory_received) / gib);
  }
}

}  // namespace cad::cli::simulate_report
