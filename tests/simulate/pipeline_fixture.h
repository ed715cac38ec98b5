// pipeline_fixture.h -- what the pipeline trainer's tests (pipeline_test.cpp: GPipe; one_f_one_b_test.cpp:
// 1F1B) share: a trainer calibration of round numbers, a system calibration, a small pipeline scenario over the
// real balancer plugins, and a scenario's refusal message.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "calibration_fixture.h"
#include "simulation.h"

namespace cad::simulate::testing {

inline TrainerCalibration pipeline_trainer() {
  TrainerCalibration c;
  c.path = "test";
  c.layer_us_per_token = 4.0;
  c.head_us_per_token = 9.0;
  c.step_fixed_ms = 7.0;
  c.attention_scale = 1.0;
  c.torch_varlen_attention_scale = 1.5;
  c.attention_call_us = 1000.0;
  c.exchange_fixed_us = 100.0;
  c.pingpong_compute_factor = 1.0;
  return c;
}

inline SystemCalibration pipeline_system() { return calibration(1, 1, 0, {{1e6, 10}, {1e8, 100}}); }

// PP stages x DP replicas of a 4-layer Llama-8B shape, 4 micro-batches of 16K tokens per replica.
inline Scenario pipeline(int64_t pp, int64_t dp, const std::vector<std::string>& balancers, PipelinePool pool,
                         const TrainerCalibration* tcal, Schedule schedule = Schedule::kGpipe) {
  Scenario s;
  s.shape = model_preset("llama-8b");
  s.shape.layers = 4;
  s.layout = Layout{pp * dp, pp * dp, 1, pp};
  for (int i = 0; i < 200; ++i) s.lengths.push_back(300 + (i * 7919) % 6000);
  for (int i = 0; i < 6; ++i) s.lengths.push_back(16384 + i * 500);
  s.context = 16384;
  s.microbatches = 4;
  s.batch_seeds = {1001, 1002, 1003, 1004};
  for (const auto& n : balancers) {
    BalancerSpec b;
    b.name = n;
    b.group_size = n == "colocated" ? 1 : 0;
    s.balancers.push_back(b);
  }
  s.search_path = CAD_BALANCER_PLUGIN_DIR;
  s.schedule = schedule;
  s.pool = pool;
  s.trainer = tcal;
  s.detail = true;
  return s;
}

inline std::string refusal(const Scenario& s) {
  const auto rates = constant_rates(600, 400, 2.5);
  try {
    simulate(s, pipeline_system(), *rates);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(not refused)";
}

}  // namespace cad::simulate::testing
