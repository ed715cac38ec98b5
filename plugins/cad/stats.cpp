// stats.cpp -- see stats.h.
#include "stats.h"

#include <nlohmann/json.hpp>

#include "plan_model.h"
#include "plugin_support.h"

namespace cad::cad_plugin {

void describe_step(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks, const Layout& layout,
                   const CallShape& shape, CallStats& call) {
  plan::ModelParams params;
  params.num_q_heads = shape.num_q_heads;
  params.num_kv_heads = shape.num_kv_heads;
  params.head_dim = shape.head_dim;
  params.bytes_per_element = static_cast<int32_t>(shape.element_bytes());
  params.causal = shape.causal;
  params.window_left = shape.window_left;
  const plan::PlanStats model = plan::evaluate_plan(tables, layout.world, tasks.data(),
                                                    static_cast<int64_t>(tasks.size()), params);
  call.servers.assign(layout.servers.size(), ServerWork{});
  for (size_t s = 0; s < layout.servers.size(); ++s) {
    ServerWork& w = call.servers[s];
    w.q_rows = layout.servers[s].q_rows;
    w.kv_rows = layout.servers[s].kv_rows;
    w.segments = static_cast<int64_t>(layout.servers[s].segments.size() + layout.own[s].segments.size());
    for (const cad_segment_v1_t& g : layout.own[s].segments) w.own_q_rows += g.q_len;
    w.score_entries = model.cost[s];
    w.forward_flops = model.flops[s];
  }
  call.model_forward_bytes_sent = model.bytes_sent;
  call.model_forward_bytes_received = model.bytes_received;
  call.imbalance = model.imbalance;
}

void gather_bytes(Comm& comm, CallStats& call) {
  struct Bytes {
    uint64_t sent, received;
  };
  const std::vector<Bytes> all = comm.all_gather_value(Bytes{call.bytes_sent, call.bytes_received});
  call.bytes_sent_by_rank.clear();
  call.bytes_received_by_rank.clear();
  for (const Bytes& b : all) {
    call.bytes_sent_by_rank.push_back(b.sent);
    call.bytes_received_by_rank.push_back(b.received);
  }
}

namespace {

nlohmann::json call_json(const CallStats& c) {
  nlohmann::json servers = nlohmann::json::array();
  for (size_t s = 0; s < c.servers.size(); ++s) {
    const ServerWork& w = c.servers[s];
    servers.push_back({{"server", s},
                       {"q_rows", w.q_rows},
                       {"kv_rows", w.kv_rows},
                       {"segments", w.segments},
                       {"own_q_rows", w.own_q_rows},
                       {"score_entries", w.score_entries},
                       {"forward_flops", w.forward_flops}});
  }
  return {{"replanned", c.replanned},
          {"plan_ms", c.plan_ms},
          {"pack_ms", c.pack_ms},
          {"exchange_ms", c.exchange_ms},
          {"compute_ms", c.compute_ms},
          {"compute_cpu_ms", c.compute_cpu_ms},
          {"wait_ms", c.wait_ms},
          {"unpack_ms", c.unpack_ms},
          {"total_ms", c.total_ms},
          {"bytes_sent", c.bytes_sent},
          {"bytes_received", c.bytes_received},
          {"bytes_sent_by_rank", c.bytes_sent_by_rank},
          {"bytes_received_by_rank", c.bytes_received_by_rank},
          {"model_forward_bytes_sent_by_rank", c.model_forward_bytes_sent},
          {"model_forward_bytes_received_by_rank", c.model_forward_bytes_received},
          {"imbalance", c.imbalance},
          {"workspace_bytes", c.workspace_bytes},
          {"saved_bytes", c.saved_bytes},
          {"servers", servers}};
}

}  // namespace

std::string stats_json(const Stats& stats) {
  nlohmann::json j = {{"rank", stats.rank}, {"world", stats.world}};
  if (stats.forward.valid) j["forward"] = call_json(stats.forward);
  if (stats.backward.valid) j["backward"] = call_json(stats.backward);
  if (stats.plan.valid) j["plan"] = call_json(stats.plan);
  if (stats.gpu_exchange.timed) {
    const ExchangeTimes& x = stats.gpu_exchange;
    j["gpu_exchange"] = {{"exchanges", x.exchanges}, {"pending", x.pending}, {"untimed", x.untimed},
                         {"comm_ms", x.comm_ms}, {"stall_ms", x.stall_ms}};
  }
  if (stats.gpu_calls.timed) {
    const CallTimes& c = stats.gpu_calls;
    j["gpu_calls"] = {{"forwards", c.forwards}, {"backwards", c.backwards}, {"pending", c.pending},
                      {"untimed", c.untimed}, {"forward_ms", c.forward_ms}, {"forward_server_ms", c.forward_server_ms},
                      {"backward_ms", c.backward_ms}, {"backward_server_ms", c.backward_server_ms}};
  }
  return j.dump();
}

std::string stats_line(const char* phase, const CallStats& c, int32_t rank) {
  return plugin::format("%s rank %d: plan %.3f ms, pack %.3f ms, exchange %.3f ms, compute %.3f ms, wait %.3f ms, unpack %.3f ms, "
                        "total %.3f ms; sent %llu B, received %llu B; server cost max/mean %.3f",
                        phase, rank, c.plan_ms, c.pack_ms, c.exchange_ms, c.compute_ms, c.wait_ms, c.unpack_ms, c.total_ms,
                        static_cast<unsigned long long>(c.bytes_sent), static_cast<unsigned long long>(c.bytes_received),
                        c.imbalance);
}

}  // namespace cad::cad_plugin
