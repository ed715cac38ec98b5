// demo_run.h -- one forward and backward through a CAD attention instance on this rank's pieces, with
// what its get_stats_json says about the step (the plan's per-server cost, bytes per rank, times).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "demo_batch.h"
#include "demo_common.h"

namespace cad::demo {

struct Shape {
  int64_t heads = 4, kv_heads = 2, head_dim = 32;
  bool causal = true;
};

constexpr int kNumOutputs = 5;
constexpr std::array<const char*, kNumOutputs> kOutputNames = {"O", "LSE", "dQ", "dK", "dV"};

struct BalancerRun {
  std::string balancer;
  std::vector<Tensor> outputs;              // kOutputNames, in that order, for this rank's tokens
  double forward_ms = 0, backward_ms = 0;   // this rank's wall time of each call
  double plan_ms = 0, compute_cpu_ms = 0;   // this rank, forward + backward, from the stats
  double compute_ms = 0;                    // the same server compute's wall time
  std::vector<double> server_score_entries; // per server, forward (the plan: the same on every rank)
  std::vector<double> server_forward_flops;
  std::vector<double> bytes_sent_by_rank;   // forward + backward, to other ranks
  std::vector<double> bytes_received_by_rank;
};

// Runs forward then backward (each after a barrier, so a call's time is its own) and reads the stats.
// Throws cad::Error naming the balancer and the call on failure.
BalancerRun run_balancer(const std::string& balancer, const cad_attention_v1_t* table, void* instance,
                         const std::vector<cad_piece_v1_t>& pieces, Inputs& inputs, const Shape& shape,
                         const Communicator& comm);

}  // namespace cad::demo
