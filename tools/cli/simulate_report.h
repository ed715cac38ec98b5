// simulate_report.h -- `cad simulate`'s output (tools/cli/cmd_simulate.cpp): the model's results (tools/simulate/)
// as JSON and the text lines naming what it priced. Pure functions of the results; nothing here reads options.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulation.h"

namespace cad::cli::simulate_report {

// Throws std::runtime_error naming the balancer where a step time is not finite (a calibration whose rates
// overflow a time; JSON would print it as null).
void require_finite(const std::vector<simulate::BalancerResult>& results);

nlohmann::json mode_json(const simulate::ModeResult& m);
nlohmann::json detail_json(const std::vector<simulate::MicroBatchDetail>& detail);
nlohmann::json ticks_json(const std::vector<simulate::TickDetail>& ticks);
const char* pool_name(simulate::PipelinePool pool);

// The result of the balancer called `name`, or nullptr.
const simulate::BalancerResult* find(const std::vector<simulate::BalancerResult>& results, const std::string& name);
// base's mean step time over r's in the mode given; 0 without a base.
double speedup(const simulate::BalancerResult* base, const simulate::BalancerResult& r, bool pingpong);

nlohmann::json network_json(const simulate::SystemCalibration& cal);
std::string network_line(const simulate::SystemCalibration& cal);
nlohmann::json tensor_parallel_json(const simulate::Scenario& s);
std::string tensor_parallel_line(const simulate::Scenario& s);

}  // namespace cad::cli::simulate_report
