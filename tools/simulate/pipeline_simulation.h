// pipeline_simulation.h -- the `cad simulate --schedule gpipe` driver: the pipeline trainer's steps
// (examples/train_pipeline.py) tick by tick, each balancer planned over the documents the schedule puts on
// each rank at each tick and priced by pipeline_model.h.
//
// Batches: micro-batch m of step k is the recipe batch over DP buffers with seed --seed + k x M + m, or the
// k x M + m-th of --batch-seeds (train_pipeline.py samples seed 1 + 1000 k + m: pass those); replica r of a
// stage holds buffer r of the micro-batch that stage runs.
// Plans, one per forward tick (the backward tick mirroring it reuses them, as the trainer does):
//   colocated         every rank keeps its own documents (local attention)
//   CAD, --pool tick  one plan over every rank of every stage (PP x DP servers), idle ranks with no documents
//   CAD, --pool stage one plan per stage over its DP replicas (in groups of the balancer's group size);
//                     with DP = 1 nothing moves and it is priced as local
//   CAD, --pool bubble --pool tick's plan in the bubble ticks (some stage idle: forward ticks t < PP - 1 or
//                     t >= M), colocated's in the steady ones, each tick priced as its pool (gpipe_tick_pool)
#pragma once

#include <vector>

#include "attention_rates.h"
#include "cad_balancer_v1.h"
#include "simulation.h"
#include "system_calibration.h"

namespace cad::simulate {

// Called by simulate() for Scenario::schedule == Schedule::kGpipe (the scenario already validated).
std::vector<BalancerResult> simulate_gpipe(const Scenario& scenario, const SystemCalibration& calibration,
                                           const AttentionRates& rates, const cad_cost_params_v1_t& cost);

}  // namespace cad::simulate
