// plan_topology.h -- `cad plan --ranks-per-node N [--inter-node-cost C]`: the node map handed to every
// balancer (its "ranks_per_node" and "inter_node_byte_cost" config keys, plugins/common/balancer_topology.h)
// and the report of each plan's bytes inside and across nodes (planning/node_map.h), per server and in total.
// Shared by both `cad plan` modes (per-rank buffers, documents longer than a rank).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "cli_args.h"
#include "node_map.h"
#include "plan_model.h"

namespace cad::cli {

struct PlanTopology {
  bool given = false;  // --ranks-per-node was on the command line
  cad::plan::NodeMap nodes;
};

// The option names both modes accept (valued).
inline const char* const kRanksPerNode = "--ranks-per-node";
inline const char* const kInterNodeCost = "--inter-node-cost";
// The usage lines of the two options.
const char* topology_usage();

// Reads the options for `ranks` ranks: UsageError naming the option for a value out of range, for
// --inter-node-cost without --ranks-per-node, or for a node size that does not divide the ranks.
PlanTopology plan_topology(const Args& args, int32_t ranks);

// `config` (a balancer's JSON object) with the two keys set when the options were given, unless `config`
// sets them itself (so that '{"ranks_per_node": R}' at R ranks asks for the topology-blind plan, which the
// report still splits by the command line's node map).
std::string with_topology(const std::string& config, const PlanTopology& topology);

// {"ranks_per_node", "inter_node_byte_cost", "nodes"} for the batch description.
nlohmann::json topology_json(const PlanTopology& topology, int32_t ranks);
// A plan's split bytes: "intra_node_bytes", "inter_node_bytes" (totals) and per server
// "intra_node_bytes_sent/received", "inter_node_bytes_sent/received".
nlohmann::json node_bytes_json(const cad::plan::PlanStats& stats, const PlanTopology& topology);

}  // namespace cad::cli
