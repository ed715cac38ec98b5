// plugin_under_test.h -- loads an attention plugin .so by path (dlopen, local scope), lends it a
// minimal services table that records log lines, and runs forward/backward on HostTensors. The
// tests drive the real shared object through its ABI table only.
#pragma once

#include <string>
#include <vector>

#include "cad_plugin_v1.h"
#include "host_tensor.h"
#include "naive_attention.h"

namespace cad::testing {

struct LogLine {
  cad_log_level_t level;
  std::string message;
};

class PluginUnderTest {
 public:
  explicit PluginUnderTest(const std::string& path);  // throws std::runtime_error if it cannot load
  ~PluginUnderTest();
  PluginUnderTest(const PluginUnderTest&) = delete;
  PluginUnderTest& operator=(const PluginUnderTest&) = delete;

  const cad_plugin_v1_t* plugin() const { return plugin_; }
  const cad_attention_v1_t* api() const { return plugin_->attention; }
  const cad_host_services_v1_t* services() const { return &services_; }
  const std::vector<LogLine>& log() const { return log_; }

 private:
  static void record(void* host_ctx, cad_log_level_t level, const char* source, const char* message);
  void* handle_ = nullptr;
  const cad_plugin_v1_t* plugin_ = nullptr;
  cad_host_services_v1_t services_{};
  std::vector<LogLine> log_;
};

// One plugin instance, destroyed with this object.
class Instance {
 public:
  Instance(const PluginUnderTest& plugin, const char* config_json);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  bool ok() const { return ctx_ != nullptr; }
  cad_status_t create_status() const { return create_status_; }
  const std::string& create_error() const { return create_error_; }
  void* ctx() const { return ctx_; }
  const char* last_error() const { return api_->last_error(ctx_); }

 private:
  const cad_attention_v1_t* api_;
  void* ctx_ = nullptr;
  cad_status_t create_status_;
  std::string create_error_;
};

// All tensors of one forward + backward of `problem`, inputs random in [-1, 1], outputs filled
// with NaN so that an element the plugin forgets to write is caught.
struct AttentionTensors {
  AttentionTensors(const Problem& problem, Dtype dtype, unsigned seed);
  HostTensor q, k, v, o, lse, d_o, d_q, d_k, d_v;
};

cad_attention_forward_args_v1_t forward_args(const Problem& p, AttentionTensors& t);
cad_attention_backward_args_v1_t backward_args(const Problem& p, AttentionTensors& t);

// Runs forward then backward (dO from the tensors) and returns both statuses.
struct RunStatus {
  cad_status_t forward = -1;
  cad_status_t backward = -1;
};
RunStatus run_forward_backward(const Instance& instance, const cad_attention_v1_t* api, const Problem& p,
                               AttentionTensors& t);

}  // namespace cad::testing
