// trainer_model.h -- one micro-batch on one rank of a real training step (`cad simulate --trainer FILE`):
// the kernel-level parts of step_model.h plus the measured overhead terms of trainer_calibration.h.
//
// Per micro-batch m and data-parallel rank r, with L layers (of this stage), T tokens, P = the forward
// passes per layer (2 with full activation checkpointing: the forward and its recomputation; else 1):
//   linear    = L x T x layer_us_per_token  +  T x head_us_per_token
//   attention = L x (kernel_scale x (P x fwd + bwd) + (P + 1) x attention_call_us)
//               fwd, bwd: the rate table's seconds for the shards r serves (step_model.h attention_seconds);
//               every attention call (local or CAD) pays the fixed call cost
//   exchange  = L x (P + 1) x (curve(bytes) + exchange_fixed_us + (sent + received) x pack_unpack_ns)
//               only for balancers that move work (a rank with no bytes to or from a peer still pays the
//               fixed part: every rank joins every exchange)
//   plan      = plans x plan_make_ms + T x plan_make_ns_per_token + tasks x plan_make_us_per_task (the
//               tasks r serves: the balancer itself is well under a millisecond, the rest of the make is
//               per rank),
//               host-blocking, before the first layer; plans = 2 with ping-pong (one per nano-batch, each
//               with half the tokens and tasks); colocated makes no plan
//   no ping-pong: total = linear + attention + exchange + plan
//   ping-pong:    the layers' compute (L x T x layer_us + attention) runs pingpong_compute_factor slower
//                 and hides `overlap` of the exchange (SystemCalibration::overlap), up to its own length:
//                 total = T x head_us + overlapped(factor x layer compute, exchange, overlap) + plan
//                 (comm_model.h; overlap 1: max(factor x layer compute, exchange))
// FSDP2 gathers and reduce-scatters every layer, so every rank waits for the slowest at each layer: the
// step is the sum over micro-batches of the slowest rank's time, plus step_fixed_ms.
#pragma once

#include <cstdint>
#include <vector>

#include "layout.h"
#include "model_shape.h"
#include "step_model.h"
#include "system_calibration.h"
#include "trainer_calibration.h"

namespace cad::simulate {

struct TrainerOptions {
  bool checkpointing = true;  // full activation checkpointing: each layer's forward runs twice
  double kernel_scale = 1;    // the calibration's attention_scale (ours) or torch_varlen_attention_scale
};

struct TrainerRankTime {
  double linear = 0;            // layers + head, seconds per micro-batch
  double attention = 0;         // kernel time of all passes, scaled
  double exchange = 0;          // CAD's exchanges, all passes
  double exchange_exposed = 0;  // the part ping-pong could not hide (all of it without ping-pong)
  double plan = 0;              // plan make
  double total = 0;
};

// `moves_work`: the balancer's plan ships attention work (every CAD balancer; not colocated, whose ranks
// keep their own documents and make no plan). `plan_tasks`: the tasks r serves in its group's plan.
TrainerRankTime trainer_rank_time(const RankWork& work, bool moves_work, int64_t plan_tasks, const ModelShape& shape,
                                  const Layout& layout, const SystemCalibration& cal, const TrainerCalibration& tcal,
                                  const TrainerOptions& options, bool pingpong);

// times[m][r] (seconds): sum over micro-batches of the slowest rank, plus the calibration's fixed part.
double trainer_step_seconds(const std::vector<std::vector<double>>& times, const TrainerCalibration& tcal);

}  // namespace cad::simulate
