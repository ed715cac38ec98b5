// balancer_harness.h -- drives a balancer plugin through its ABI alone: dlopen by path (local symbol
// scope), the entry symbol, create/plan/release_plan/destroy with a minimal services table. Used by
// the balancer tests and the planning benchmark (header-only, no host adapter needed).
#pragma once

#include <dlfcn.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cad_plugin_v1.h"
#include "plan_model.h"

namespace cad::balancer_test {

using RankPieces = cad::plan::RankPieces;

inline cad_cost_params_v1_t cost_params(int64_t min_shard = 128, int64_t memory_cap = 0, bool causal = true,
                                        int32_t heads = 32, int32_t kv_heads = 8, int32_t head_dim = 128) {
  cad_cost_params_v1_t c{};
  c.struct_size = sizeof(c);
  c.num_q_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.bytes_per_element = 2;
  c.causal = causal ? 1 : 0;
  c.min_shard_tokens = min_shard;
  c.memory_cap_bytes = memory_cap;
  return c;
}

struct PlanResult {
  cad_status_t status = CAD_STATUS_INTERNAL;
  std::string error;
  int32_t num_servers = 0;
  uint32_t format_version = 0;
  std::vector<cad_task_v1_t> tasks;
};

class LoadedBalancer {
 public:
  explicit LoadedBalancer(const std::string& path, const std::string& config = "{}") {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) throw std::runtime_error("dlopen " + path + ": " + dlerror());
    auto entry = reinterpret_cast<cad_plugin_entry_v1_fn>(dlsym(handle_, CAD_PLUGIN_ENTRY_SYMBOL_V1));
    if (entry == nullptr) throw std::runtime_error(path + ": no entry symbol");
    plugin_ = entry();
    if (plugin_ == nullptr || plugin_->abi_major != CAD_ABI_VERSION_MAJOR || plugin_->balancer == nullptr ||
        plugin_->kind != CAD_PLUGIN_KIND_BALANCER) {
      throw std::runtime_error(path + ": not a v1 balancer plugin");
    }
    table_ = plugin_->balancer;
    services_.struct_size = sizeof(services_);
    services_.abi_major = CAD_ABI_VERSION_MAJOR;
    services_.abi_minor = CAD_ABI_VERSION_MINOR;
    services_.log_level = CAD_LOG_OFF;
    services_.bootstrap_rank = -1;
    char message[512] = {0};
    create_status_ = table_->create(&services_, config.c_str(), &ctx_, message, sizeof(message));
    create_error_ = message;
  }
  ~LoadedBalancer() {
    if (ctx_ != nullptr) table_->destroy(ctx_);
    if (handle_ != nullptr) dlclose(handle_);
  }
  LoadedBalancer(const LoadedBalancer&) = delete;
  LoadedBalancer& operator=(const LoadedBalancer&) = delete;

  const cad_plugin_v1_t* plugin() const { return plugin_; }
  cad_status_t create_status() const { return create_status_; }
  const std::string& create_error() const { return create_error_; }

  PlanResult plan(const RankPieces& ranks, int32_t num_servers, const cad_cost_params_v1_t& cost) const {
    std::vector<cad_rank_pieces_v1_t> views;
    for (const auto& r : ranks) views.push_back({r.data(), static_cast<int64_t>(r.size())});
    cad_balance_input_v1_t input{};
    input.struct_size = sizeof(input);
    input.ranks = views.data();
    input.num_ranks = static_cast<int32_t>(views.size());
    input.num_servers = num_servers;
    input.cost = &cost;
    return plan(input);
  }

  PlanResult plan(const cad_balance_input_v1_t& input) const {
    PlanResult out;
    if (ctx_ == nullptr) throw std::runtime_error("plugin was not created: " + create_error_);
    cad_plan_v1_t* plan = nullptr;
    out.status = table_->plan(ctx_, &input, &plan);
    if (out.status != CAD_STATUS_OK) {
      out.error = table_->last_error(ctx_);
      return out;
    }
    out.num_servers = plan->num_servers;
    out.format_version = plan->format_version;
    out.tasks.assign(plan->tasks, plan->tasks + plan->num_tasks);
    table_->release_plan(ctx_, plan);
    return out;
  }

 private:
  void* handle_ = nullptr;
  const cad_plugin_v1_t* plugin_ = nullptr;
  const cad_balancer_v1_t* table_ = nullptr;
  cad_host_services_v1_t services_{};
  void* ctx_ = nullptr;
  cad_status_t create_status_ = CAD_STATUS_INTERNAL;
  std::string create_error_;
};

}  // namespace cad::balancer_test
