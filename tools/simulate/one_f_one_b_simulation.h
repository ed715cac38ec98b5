// one_f_one_b_simulation.h -- the `cad simulate --schedule 1f1b_ticks` driver: the pipeline trainer's 1F1B steps
// (examples/train_pipeline.py --schedule 1f1b) tick by tick on its timetable (pipeline_model.h
// one_f_one_b_schedule), each balancer planned per (micro-batch, stage) and priced by pipeline_model.h
// one_f_one_b_tick.
//
// Batches as in --schedule gpipe (pipeline_simulation.h): micro-batch m of step k is the recipe batch over DP
// buffers with seed --seed + k x M + m, or the k x M + m-th of --batch-seeds; replica r of a stage holds buffer r.
// Plans, one per (micro-batch m, stage s), used by that stage's forward of m and its backward of m (the trainer
// makes them ahead on CAD's planning thread, so their making is not priced):
//   colocated         every rank keeps its own documents (local attention)
//   CAD, --pool tick  one plan over every rank of every stage (PP x DP servers), only stage s's ranks holding
//                     documents
//   CAD, --pool stage one plan over stage s's DP replicas (in groups of the balancer's group size); with DP = 1
//                     nothing moves and it is priced as local
//   CAD, --pool bubble (full checkpointing only) an operation in a tick where some stage is idle uses --pool
//                     tick's plan of its (m, s), one in a steady tick local attention (each rank its own); a
//                     forward and its backward can differ, each recomputing under its own tick's pool
// Step: under --pool tick the sum of its ticks; local and --pool stage the last rank's end on OneFOneBClocks
// (the stages meet only at the ticks where they send to each other), each tick's detail giving every rank's end;
// --pool bubble the same clocks, every rank meeting at a bubble tick (OneFOneBClocks::add_pooled).
#pragma once

#include <vector>

#include "attention_rates.h"
#include "cad_balancer_v1.h"
#include "simulation.h"
#include "system_calibration.h"

namespace cad::simulate {

// Called by simulate() for Scenario::schedule == Schedule::k1f1bTicks (the scenario already validated).
std::vector<BalancerResult> simulate_1f1b_ticks(const Scenario& scenario, const SystemCalibration& calibration,
                                                const AttentionRates& rates, const cad_cost_params_v1_t& cost);

}  // namespace cad::simulate
