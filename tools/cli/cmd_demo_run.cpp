// cmd_demo_run.cpp -- see demo_run.h.
#include "demo_run.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace cad::demo {
namespace {

using nlohmann::json;

json read_stats(const cad_attention_v1_t* table, void* instance, const std::string& balancer) {
  if (table->get_stats_json == nullptr) {
    throw cad::Error(CAD_STATUS_UNSUPPORTED, "the attention instance has no get_stats_json (is it a CAD instance?)");
  }
  size_t needed = 0;
  table->get_stats_json(instance, nullptr, 0, &needed);  // INVALID_ARGUMENT with the size: expected
  std::string text(needed, '\0');
  require(table->get_stats_json(instance, text.data(), text.size(), &needed), table, instance,
          balancer + ": get_stats_json");
  json stats = json::parse(text.c_str(), nullptr, /*allow_exceptions=*/false);
  if (!stats.is_object() || !stats.contains("forward") || !stats.contains("backward")) {
    throw cad::Error(CAD_STATUS_INTERNAL, balancer + ": get_stats_json lacks \"forward\"/\"backward\": " + text);
  }
  return stats;
}

// Element-wise sum of two calls' per-rank byte lists.
std::vector<double> add_by_rank(const json& forward, const json& backward, const char* key) {
  std::vector<double> sum;
  for (const json* call : {&forward, &backward}) {
    const std::vector<double> values = call->at(key).get<std::vector<double>>();
    if (sum.size() < values.size()) sum.resize(values.size(), 0.0);
    for (size_t r = 0; r < values.size(); ++r) sum[r] += values[r];
  }
  return sum;
}

}  // namespace

BalancerRun run_balancer(const std::string& balancer, const cad_attention_v1_t* table, void* instance,
                         const std::vector<cad_piece_v1_t>& pieces, Inputs& in, const Shape& shape,
                         const Communicator& comm) {
  BalancerRun run;
  run.balancer = balancer;
  const int64_t tokens = in.q.shape[0];
  run.outputs.emplace_back(std::vector<int64_t>{tokens, shape.heads, shape.head_dim});  // O
  run.outputs.emplace_back(std::vector<int64_t>{shape.heads, tokens});                  // LSE
  run.outputs.emplace_back(std::vector<int64_t>{tokens, shape.heads, shape.head_dim});  // dQ
  run.outputs.emplace_back(std::vector<int64_t>{tokens, shape.kv_heads, shape.head_dim});  // dK
  run.outputs.emplace_back(std::vector<int64_t>{tokens, shape.kv_heads, shape.head_dim});  // dV

  cad_attention_forward_args_v1_t fwd{};
  fwd.struct_size = sizeof fwd;
  fwd.pieces = pieces.data();
  fwd.num_pieces = static_cast<int64_t>(pieces.size());
  fwd.softmax_scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  fwd.causal = shape.causal ? 1 : 0;
  fwd.q = &in.q.view;
  fwd.k = &in.k.view;
  fwd.v = &in.v.view;
  fwd.o = &run.outputs[0].view;
  fwd.lse = &run.outputs[1].view;
  comm.barrier();
  auto start = std::chrono::steady_clock::now();
  require(table->forward(instance, &fwd), table, instance, balancer + ": forward");
  run.forward_ms = milliseconds_since(start);

  cad_attention_backward_args_v1_t bwd{};
  bwd.struct_size = sizeof bwd;
  bwd.pieces = fwd.pieces;
  bwd.num_pieces = fwd.num_pieces;
  bwd.softmax_scale = fwd.softmax_scale;
  bwd.causal = fwd.causal;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.o = fwd.o;
  bwd.lse = fwd.lse;
  bwd.d_o = &in.d_o.view;
  bwd.d_q = &run.outputs[2].view;
  bwd.d_k = &run.outputs[3].view;
  bwd.d_v = &run.outputs[4].view;
  comm.barrier();
  start = std::chrono::steady_clock::now();
  require(table->backward(instance, &bwd), table, instance, balancer + ": backward");
  run.backward_ms = milliseconds_since(start);

  const json stats = read_stats(table, instance, balancer);
  const json& f = stats["forward"];
  const json& b = stats["backward"];
  run.plan_ms = f.at("plan_ms").get<double>() + b.at("plan_ms").get<double>();
  run.compute_cpu_ms = f.at("compute_cpu_ms").get<double>() + b.at("compute_cpu_ms").get<double>();
  run.compute_ms = f.at("compute_ms").get<double>() + b.at("compute_ms").get<double>();
  for (const json& server : f.at("servers")) {
    run.server_score_entries.push_back(server.at("score_entries").get<double>());
    run.server_forward_flops.push_back(server.at("forward_flops").get<double>());
  }
  run.bytes_sent_by_rank = add_by_rank(f, b, "bytes_sent_by_rank");
  run.bytes_received_by_rank = add_by_rank(f, b, "bytes_received_by_rank");
  return run;
}

}  // namespace cad::demo
