// simulate_report.h -- `cad simulate`'s output (tools/cli/cmd_simulate.cpp): the model's results (tools/simulate/)
// as JSON and as text, and the lines naming what it priced. Pure functions of the results and of the options the
// caller parsed (SimulateRun); nothing here reads the command line.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention_rates.h"
#include "simulation.h"
#include "trainer_calibration.h"

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

// What one `cad simulate` run priced, for the report: the scenario and calibrations it ran with, its results, and
// the options that only the report reads. References into the caller's objects, which outlive the report.
struct SimulateRun {
  const simulate::Scenario& scenario;
  const simulate::SystemCalibration& cal;
  const simulate::AttentionRates& rates;
  const simulate::TrainerCalibration* trainer;  // nullptr without --trainer
  const std::vector<simulate::BalancerResult>& results;
  const simulate::BatchSummary& summary;
  std::string dist, schedule, pingpong;  // --dist, --schedule, --pingpong (on, off or both)
  bool balance_time, has_tolerance;
  double tolerance;
  double wall_seconds;  // the simulation's own time

  // What the scenario itself says: long documents (a --max-doc-len), the pipeline trainer's schedules, and the
  // data-parallel (CAD) ranks of a node.
  bool long_docs() const { return scenario.max_doc_len > 0; }
  bool trainer_pipeline() const { return simulate::is_trainer_pipeline(scenario.schedule); }
  int64_t ranks_per_node() const { return scenario.layout.gpus_per_node / scenario.layout.tp; }
};
// --json's document; the text report (to stdout) otherwise.
nlohmann::json report_json(const SimulateRun& run);
void print_report(const SimulateRun& run);

}  // namespace cad::cli::simulate_report
