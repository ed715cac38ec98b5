// simulate_report.cpp -- `cad simulate`'s output: the model's results as JSON (per rank, per micro-batch, per
// pipeline tick) and the text lines that name the network and the tensor-parallel layout it priced.
#include "simulate_report.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor_slices.h"

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

}  // namespace cad::cli::simulate_report
