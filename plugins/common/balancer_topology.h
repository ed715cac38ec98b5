// balancer_topology.h -- the node map every balancer reads from its config, and the check that every
// rank configured the same one. Keys (all optional; without them every rank is on one node and the
// balancers plan as they did before they knew the topology):
//   "ranks_per_node"         int >= 1: ranks r and s share a node iff r / ranks_per_node == s / ranks_per_node
//   "inter_node_byte_cost"   number >= 1: what a byte that leaves its node costs against one that stays
//                            (default plan::kDefaultInterNodeByteCost, a placeholder: node_map.h)
//   "node_map_communicator"  the instance name of a host-memory communicator (e.g. "mpi" or "host")
//                            created before this balancer: at create, every rank all-gathers its node map
//                            over it and every rank refuses (INVALID_CONFIG, naming rank 0, the first rank
//                            that differs and both values) unless all agree. Plans are computed on every
//                            rank independently, so two node maps would give two plans that do not fit
//                            together. Without it the map is not compared across ranks (a debug line says so).
#pragma once

#include <string>

#include "node_map.h"
#include "plugin_support.h"

namespace cad::balancer {

struct NodeMapConfig {
  plan::NodeMap nodes;
  std::string communicator;  // "node_map_communicator"; empty: not checked across ranks
};

// Reads the three keys; fails INVALID_CONFIG naming the key (ConfigReader's message) on a bad value.
NodeMapConfig read_node_map(plugin::ConfigReader& config);

// The cross-rank check over the communicator instance `config.communicator` (nothing when empty). Collective:
// every rank that creates this balancer must create it (stack configs are the same list on every rank).
// Fails INVALID_CONFIG when the instance is missing or the maps differ; a failed all_gather's status passes
// through with the communicator's message.
void check_node_map_agrees(const cad_host_services_v1_t* services, const NodeMapConfig& config,
                           const plugin::Logger& log);

// The message of a disagreement, or "" when every entry equals rank 0's (exposed for the unit tests).
std::string node_map_disagreement(const std::vector<plan::NodeMap>& maps);

}  // namespace cad::balancer
