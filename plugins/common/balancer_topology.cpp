// balancer_topology.cpp -- see balancer_topology.h.
#include "balancer_topology.h"

#include <cstring>
#include <vector>

#include "cad_communicator_v1.h"

namespace cad::balancer {

using plugin::fail;
using plugin::format;

namespace {

// What one rank sends: fixed size, no padding left uninitialised.
struct WireNodeMap {
  int64_t ranks_per_node;
  double inter_node_byte_cost;
};

std::string describe(const plan::NodeMap& m) {
  if (m.ranks_per_node == 0) return format("no ranks_per_node (one node), inter_node_byte_cost %g", m.inter_node_byte_cost);
  return format("ranks_per_node %d, inter_node_byte_cost %g", m.ranks_per_node, m.inter_node_byte_cost);
}

}  // namespace

NodeMapConfig read_node_map(plugin::ConfigReader& config) {
  NodeMapConfig out;
  out.nodes.ranks_per_node = static_cast<int32_t>(config.get_int("ranks_per_node", 0, 1, 1 << 20));
  // Below 1 a byte would be cheaper leaving its node than staying: no link is like that.
  out.nodes.inter_node_byte_cost =
      config.get_double("inter_node_byte_cost", plan::kDefaultInterNodeByteCost, 1.0, 1e6);
  out.communicator = config.get_string("node_map_communicator", "");
  return out;
}

std::string node_map_disagreement(const std::vector<plan::NodeMap>& maps) {
  for (size_t r = 1; r < maps.size(); ++r) {
    const plan::NodeMap& a = maps[0];
    const plan::NodeMap& b = maps[r];
    if (a.ranks_per_node != b.ranks_per_node || a.inter_node_byte_cost != b.inter_node_byte_cost) {
      return format("ranks disagree on the node map: rank 0 has %s, rank %zu has %s (every rank must plan with "
                    "the same topology)", describe(a).c_str(), r, describe(b).c_str());
    }
  }
  return "";
}

void check_node_map_agrees(const cad_host_services_v1_t* services, const NodeMapConfig& config,
                           const plugin::Logger& log) {
  if (config.communicator.empty()) {
    if (config.nodes.ranks_per_node > 0) {
      log.debug("node map not compared across ranks: no 'node_map_communicator' in the config");
    }
    return;
  }
  const void* table = nullptr;
  void* instance = nullptr;
  if (services == nullptr || services->lookup_plugin == nullptr ||
      services->lookup_plugin(services->host_ctx, config.communicator.c_str(), CAD_PLUGIN_KIND_COMMUNICATOR, &table,
                              &instance) != CAD_STATUS_OK ||
      table == nullptr) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("config key 'node_map_communicator' names '%s', which is no communicator instance created before "
                "this balancer", config.communicator.c_str()));
  }
  const auto* comm = static_cast<const cad_communicator_v1_t*>(table);
  int32_t world = 0;
  if (comm->get_world_size(instance, &world) != CAD_STATUS_OK || world < 1) {
    fail(CAD_STATUS_INVALID_CONFIG, format("node_map_communicator '%s': no world size", config.communicator.c_str()));
  }
  const WireNodeMap mine{config.nodes.ranks_per_node, config.nodes.inter_node_byte_cost};
  std::vector<WireNodeMap> all(static_cast<size_t>(world));
  const cad_status_t status = comm->all_gather(instance, &mine, sizeof mine, all.data(), nullptr);
  if (status != CAD_STATUS_OK) {
    const char* message = comm->last_error(instance);
    fail(status, format("node_map_communicator '%s': all_gather of the node map failed: %s",
                        config.communicator.c_str(), message != nullptr ? message : "(no message)"));
  }
  std::vector<plan::NodeMap> maps;
  for (const WireNodeMap& w : all) maps.push_back({static_cast<int32_t>(w.ranks_per_node), w.inter_node_byte_cost});
  const std::string problem = node_map_disagreement(maps);
  if (!problem.empty()) fail(CAD_STATUS_INVALID_CONFIG, problem);
}

}  // namespace cad::balancer
