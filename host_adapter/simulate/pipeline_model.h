// pipeline_model.h -- the GPipe pipeline trainer (examples/train_pipeline.py) as `cad simulate --schedule
// gpipe` prices it: PP stages x DP replicas (rank = stage x DP + replica), M micro-batches per step, the
// trainer calibration's terms (trainer_calibration.h) split by tick.
//
// Schedule: T = M + PP - 1 forward ticks, then T backward ticks. At forward tick t stage s runs micro-batch
// t - s (idle outside [0, M)); backward tick b mirrors forward tick T - 1 - b (the last micro-batch first).
//
// One stage-tick of a rank with n tokens, its layers l = L / PP, P = 1 + (full checkpointing):
//   non-attention per layer: n x layer_us_per_token / 4 in a forward tick, n x layer_us_per_token x (P + 1)
//     / 4 in a backward tick -- layer_us_per_token was fitted on the data-parallel trainer with full
//     checkpointing: a layer's forward, recomputed forward and backward (a backward is 2 forwards' GEMMs), 4
//     forward units; the forward tick runs 1, the backward tick the recomputation and the backward (3; 2
//     without checkpointing)
//   head (last stage only, when it runs a micro-batch): n x head_us_per_token, 1/4 in the forward tick and
//     3/4 in the backward (the trainer's chunked loss recomputes the logits in the backward: forward,
//     recomputation, backward = 2 GEMMs, as a checkpointed layer); the embedding (stage 0) is a lookup and its
//     gradient a scatter-add, taken as 0 (the calibration has no separate term for it)
//   attention per layer: kernel_scale x (the direction's kernel seconds) + calls x attention_call_us, calls
//     = 1 forward, P backward (the recomputed forward and the backward)
//   exchange per layer (CAD moving work): passes x (curve(bytes) + exchange_fixed_us + bytes x pack_unpack)
// Plans are made ahead on CAD's planning thread (run 17: 0 ms of plan wait), so plan make is not counted.
//
// Tick time, by how attention is pooled:
//   local  (colocated; or --pool stage with DP = 1, which moves nothing): ranks are independent within a
//          tick and meet only at the send/recv between ticks: tick = max over ranks of
//          l x (non-attention + attention) + head
//   stage  (CAD within each stage's DP ranks): the same, each rank's attention being what its stage's plan
//          gives it, plus the exchange
//   tick   (one CAD group over every rank, one plan per tick over the documents the stages hold then; idle
//          ranks hold none but serve): every attention call is collective over all stages, so they move in
//          lockstep through their layers: tick = l x (max over ranks of non-attention + max over ranks of
//          attention + exchange) + head (the other stages wait for the head at the next tick's first call)
// Step = sum over the 2T ticks + step_fixed_ms; with local attention each replica's stages are a pipeline of
// their own (nothing couples replicas before the step's gradient all-reduce), so the step is the slowest
// replica's sum of its ticks (each tick priced over that replica's stages). Ping-pong is not modelled for this
// schedule (priced as off).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "step_model.h"
#include "system_calibration.h"
#include "trainer_calibration.h"
#include "trainer_model.h"

namespace cad::simulate {

enum class PipelinePool { kLocal, kStage, kTick };

// One tick of the GPipe schedule: which micro-batch each stage runs (-1: idle).
struct GpipeTick {
  bool backward = false;
  int64_t index = 0;  // tick within its phase, 0..T-1
  std::vector<int64_t> micro_batch;  // per stage
};

// The 2 (M + PP - 1) ticks of one step, forward ticks first. Throws std::invalid_argument for stages < 1 or
// micro-batches < 1.
std::vector<GpipeTick> gpipe_schedule(int64_t stages, int64_t microbatches);

// What one rank does in one tick, per layer of its stage (seconds), and its head.
struct TickRankTime {
  int64_t tokens = 0;
  double non_attention = 0;  // per layer
  double attention = 0;      // per layer, kernels and calls
  double exchange = 0;       // per layer
  double head = 0;           // once, last stage only
  double total = 0;          // per layer: non-attention + attention + exchange (the rank alone)
};

// `work`: the rank's tokens and the shards it serves (one layer); `joins_calls`: it makes this tick's
// attention calls (it runs a micro-batch, or it serves under tick pooling); `moves_work`: the plan ships work
// (pays the exchange); `last_stage`: pays the head when it runs a micro-batch.
TickRankTime tick_rank_time(const RankWork& work, bool backward, bool joins_calls, bool moves_work, bool last_stage,
                            const SystemCalibration& cal, const TrainerCalibration& tcal,
                            const TrainerOptions& options);

// One tick's seconds from its ranks (stage-major: rank = stage x DP + replica) and the stage's layer count.
double tick_seconds(const std::vector<TickRankTime>& ranks, int64_t layers_per_stage, PipelinePool pool);

}  // namespace cad::simulate
