// balancer_runner.cpp -- a balancer plugin behind a small C++ object.
#include "balancer_runner.h"

#include "cad/cad_host.hpp"

#include <chrono>
#include <cstdio>
#include <stdexcept>

namespace cad::simulate {

namespace {

void log_to_stderr(void*, cad_log_level_t level, const char* source, const char* message) {
  std::fprintf(stderr, "[%s] %s: %s\n", level >= CAD_LOG_ERROR ? "error" : "warn", source, message);
}

const cad_host_services_v1_t* services() {
  static const cad_host_services_v1_t s = [] {
    cad_host_services_v1_t v{};
    v.struct_size = sizeof v;
    v.abi_major = CAD_ABI_VERSION_MAJOR;
    v.abi_minor = CAD_ABI_VERSION_MINOR;
    v.log_level = CAD_LOG_WARN;
    v.log = &log_to_stderr;
    v.bootstrap_rank = -1;
    return v;
  }();
  return &s;
}

}  // namespace

BalancerRunner::BalancerRunner(const std::string& name_or_path, const std::string& config_json,
                               const std::string& search_path)
    : library_(name_or_path, search_path.empty() ? nullptr : search_path.c_str()) {
  const cad_plugin_v1_t& plugin = library_.plugin();
  name_ = plugin.name;
  if (plugin.kind != CAD_PLUGIN_KIND_BALANCER || plugin.balancer == nullptr) {
    throw std::runtime_error(library_.path() + " is not a balancer plugin");
  }
  table_ = plugin.balancer;
  char message[2048] = {0};
  if (table_->create(services(), config_json.c_str(), &ctx_, message, sizeof message) != CAD_STATUS_OK) {
    throw std::runtime_error("balancer '" + name_ + "': create failed: " + message);
  }
}

BalancerRunner::~BalancerRunner() {
  if (ctx_ != nullptr) table_->destroy(ctx_);
}

BalancerRunner::Attempt BalancerRunner::try_plan(const cad::plan::RankPieces& ranks,
                                                 const cad_cost_params_v1_t& cost) {
  std::vector<cad_rank_pieces_v1_t> views;
  views.reserve(ranks.size());
  for (const auto& r : ranks) views.push_back({r.data(), static_cast<int64_t>(r.size())});
  cad_balance_input_v1_t input{};
  input.struct_size = sizeof input;
  input.ranks = views.data();
  input.num_ranks = static_cast<int32_t>(views.size());
  input.num_servers = input.num_ranks;
  input.cost = &cost;
  Attempt out;
  cad_plan_v1_t* plan = nullptr;
  const auto start = std::chrono::steady_clock::now();
  out.status = table_->plan(ctx_, &input, &plan);
  out.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (out.status != CAD_STATUS_OK) {
    out.error = cad::last_error_of(table_, ctx_);
    return out;
  }
  // Never trust a plugin's OK: no plan, or a task array that does not match its count, is its bug.
  if (plan == nullptr || plan->num_tasks < 0 || (plan->num_tasks > 0 && plan->tasks == nullptr)) {
    out.status = CAD_STATUS_INTERNAL;
    out.error = "plugin " + library_.path() + ": plan returned OK but " +
                (plan == nullptr ? std::string("no plan")
                                 : "a plan with " + std::to_string(plan->num_tasks) + " tasks at " +
                                       (plan->tasks != nullptr ? "a non-NULL" : "a NULL") + " array");
    if (plan != nullptr) table_->release_plan(ctx_, plan);
    return out;
  }
  out.tasks.assign(plan->tasks, plan->tasks + plan->num_tasks);
  table_->release_plan(ctx_, plan);
  return out;
}

std::vector<cad_task_v1_t> BalancerRunner::plan(const cad::plan::RankPieces& ranks, const cad_cost_params_v1_t& cost) {
  Attempt a = try_plan(ranks, cost);
  if (a.status != CAD_STATUS_OK) {
    throw std::runtime_error("balancer '" + name_ + "': plan failed (" + cad_status_name(a.status) + "): " + a.error);
  }
  return std::move(a.tasks);
}

}  // namespace cad::simulate
