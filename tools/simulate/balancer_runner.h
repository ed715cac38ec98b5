// balancer_runner.h -- one balancer plugin, loaded and created once, planning many batches through the
// ABI (as CAD itself calls it): `cad plan` inspects its plans, and the simulator prices them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cad_balancer_v1.h"
#include "cad_host.hpp"
#include "plan_model.h"

namespace cad::simulate {

class BalancerRunner {
 public:
  // `name_or_path`: a plugin name or .so path, searched in `search_path` (colon-separated) first;
  // `config_json`: the plugin's config. Throws std::runtime_error naming the plugin on failure.
  BalancerRunner(const std::string& name_or_path, const std::string& config_json, const std::string& search_path);
  ~BalancerRunner();
  BalancerRunner(const BalancerRunner&) = delete;
  BalancerRunner& operator=(const BalancerRunner&) = delete;

  // The plugin's own name (e.g. "prefix_aware").
  const std::string& name() const { return name_; }
  struct Attempt {
    cad_status_t status = CAD_STATUS_OK;
    std::string error;                 // the plugin's message when status is not OK
    std::vector<cad_task_v1_t> tasks;  // the plan when status is OK
    double plan_ms = 0;                // the plugin's plan call alone
  };
  // Plans `ranks` on as many servers; a plugin's refusal comes back in the result.
  Attempt try_plan(const cad::plan::RankPieces& ranks, const cad_cost_params_v1_t& cost);
  // The same; throws std::runtime_error with the status and the plugin's message.
  std::vector<cad_task_v1_t> plan(const cad::plan::RankPieces& ranks, const cad_cost_params_v1_t& cost);

 private:
  cad::Library library_;
  std::string name_;
  const cad_balancer_v1_t* table_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace cad::simulate
