// step_model.h -- one training step's time from each data-parallel rank's work.
//
// Per layer and micro-batch, a rank (one GPU of each tensor-parallel slice; all slices alike):
//   linear   = tokens x linear FLOPs per token / tp / GEMM rate  +  memory-bound element-wise work;
//              backward = 2 x forward
//   attention = sum over the shards it serves of FLOPs / rate(q, kv), forward and backward
//   comm     = its all_to_all_v of the plan's bytes (forward: Q, K/V out and O, LSE back; backward: the
//              same bytes per link: dO out, dQ and dK/dV back)
//   tp comm  = 4 ring collectives (sequence parallel: 2 all-gathers + 2 reduce-scatters) of the tokens'
//              activations per pass, when tp > 1; never hidden
//   pass     = ping-pong: linear + attention + comm - min(overlap x comm, linear + attention) -- two
//              nano-batches, `overlap` (SystemCalibration::overlap) of one's communication under the other's
//              compute; overlap 1 is max(linear + attention, comm); without: linear + attention + comm
// A stage (layers / pp layers) adds the output projection (forward + backward) once.
//
// The step: ranks that exchange attention work meet at every layer's all_to_all_v, so a group's
// micro-batch takes its slowest member's time; without pipeline parallelism a group's step is the sum
// over its micro-batches, with pp stages a 1F1B pipeline adds (pp - 1) x its slowest micro-batch (fill
// and drain). Data parallelism then waits for the slowest group (the gradient all-reduce is assumed
// hidden under the backward and is not counted).
#pragma once

#include <cstdint>
#include <vector>

#include "attention_rates.h"
#include "comm_model.h"
#include "layout.h"
#include "model_shape.h"
#include "system_calibration.h"

namespace cad::simulate {

// One attention shard as a server computes it: q queries whose last one sees kv keys, `entries` score
// entries (causal: q*kv - q*(q-1)/2; non-causal: q*kv, every query sees every key).
struct Shard {
  int64_t q = 0;
  int64_t kv = 0;
  int64_t entries = 0;
  bool causal = true;  // the backward's tile pairs depend on it (rate_table.h "backward_tiles")
};

// Forward and backward seconds of one layer's shards on one GPU (heads_per_gpu query heads of
// head_dim), each shard at the table's rate for its shape (the backward by AttentionRates::bwd_seconds).
struct AttentionSeconds {
  double fwd = 0, bwd = 0, fwd_flops = 0;
};
AttentionSeconds attention_seconds(const std::vector<Shard>& shards, int64_t heads_per_gpu, int64_t head_dim,
                                   const AttentionRates& rates);

// What one data-parallel rank does per layer in one micro-batch.
struct RankWork {
  int64_t tokens = 0;       // tokens whose linear layers it runs
  AttentionSeconds attention;  // the shards it serves
  RankBytes bytes;          // its all_to_all_v per pass
};

// Seconds of one micro-batch on one rank for a whole stage, by part.
struct RankTime {
  double linear = 0;        // forward + backward, all layers of the stage, plus the output projection
  double attention = 0;     // forward + backward
  double comm = 0;          // all_to_all_v, forward + backward
  double comm_exposed = 0;  // the part of comm not hidden by ping-pong
  double tp_comm = 0;
  double plan = 0;          // plan make (the trainer model, trainer_model.h; 0 in this model)
  double total = 0;
};

RankTime rank_time(const RankWork& work, const ModelShape& shape, const Layout& layout,
                   const SystemCalibration& cal, bool pingpong);

// times[i][r]: micro-batch i on data-parallel rank r. Ranks [g*group, (g+1)*group) form group g (the
// last group may be shorter). Returns the step's seconds.
double step_seconds(const std::vector<std::vector<double>>& times, int64_t group_size, int64_t pp);

}  // namespace cad::simulate
