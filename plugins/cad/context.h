// context.h -- one CAD instance: its config, the three instances it borrows from the host
// (communicator, balancer, server backend), and what it keeps between forward and backward.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "cad_plugin_v1.h"
#include "comm.h"
#include "plugin_support.h"
#include "stats.h"
#include "step.h"
#include "validate.h"

namespace cad::cad_plugin {

struct Config {
  std::string communicator;        // instance names in the host's config
  std::string balancer;
  std::string server_backend;
  bool keep_forward_tensors = true;  // servers keep Q/K/V/O/LSE of the last forward for backward
  PlanKnobs knobs;                   // min_shard_tokens, memory_cap_bytes for the balancer's cost model
};

struct ServerBackend {
  const cad_attention_v1_t* table = nullptr;
  void* instance = nullptr;
  std::string name;
  cad_attention_capabilities_v1_t caps{};
};

// The server batch of the last forward, kept for backward when keep_forward_tensors is true.
struct KeptBatch {
  std::vector<std::byte> q, k, v, o;
  std::vector<float> lse;
};

// The last forward, as backward needs to recognise and reuse it.
struct LastForward {
  Step step;
  std::vector<cad_piece_v1_t> local_pieces;
  bool has_kept_batch = false;
  KeptBatch kept;
};

struct CadContext : plugin::ErrorState {
  CadContext(const cad_host_services_v1_t* services, const char* config_json);

  plugin::Logger logger;
  Config config;
  std::unique_ptr<Comm> comm;
  BalancerRef balancer;
  ServerBackend server;
  Accepts accepts;  // what the server backend takes, hence what CAD takes
  std::unique_ptr<LastForward> last_forward;
  Stats stats;
};

// The capabilities CAD reports: the server backend's, restricted to what the CPU data path moves.
cad_attention_capabilities_v1_t cad_capabilities(const CadContext& ctx);

}  // namespace cad::cad_plugin
