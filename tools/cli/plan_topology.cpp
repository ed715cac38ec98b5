// plan_topology.cpp -- see plan_topology.h.
#include "plan_topology.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace cad::cli {

const char* topology_usage() {
  return "  --ranks-per-node N  ranks r and s share a node iff r / N == s / N (N must divide --ranks): hands\n"
         "                    every balancer the config keys \"ranks_per_node\" and \"inter_node_byte_cost\",\n"
         "                    and reports each plan's forward bytes inside and across nodes, per server and\n"
         "                    in total (default: one node, nothing reported). A --config that sets\n"
         "                    \"ranks_per_node\" itself keeps it: '{\"ranks_per_node\": R}' at R ranks is the\n"
         "                    topology-blind plan, still reported by N\n"
         "  --inter-node-cost C  what a byte that leaves its node costs against one that stays (>= 1;\n"
         "                    default 9, the nominal NVLink/InfiniBand ratio, not a measurement)\n";
}

PlanTopology plan_topology(const Args& args, int32_t ranks) {
  PlanTopology t;
  if (!args.has(kRanksPerNode)) {
    if (args.has(kInterNodeCost)) throw UsageError("--inter-node-cost needs --ranks-per-node");
    return t;
  }
  t.given = true;
  t.nodes.ranks_per_node = static_cast<int32_t>(args.get_int(kRanksPerNode, 1, 1, 1 << 20));
  if (ranks % t.nodes.ranks_per_node != 0) {
    throw UsageError("--ranks-per-node " + std::to_string(t.nodes.ranks_per_node) + " does not divide --ranks " +
                     std::to_string(ranks) + " (nodes hold the same number of ranks)");
  }
  if (args.has(kInterNodeCost)) {
    const std::string text = args.get(kInterNodeCost, "");
    char* end = nullptr;
    errno = 0;
    const double c = std::strtod(text.c_str(), &end);
    if (text.empty() || end == nullptr || *end != '\0' || errno != 0 || !std::isfinite(c) || c < 1.0 || c > 1e6) {
      throw UsageError("--inter-node-cost '" + text + "': expected a number in [1, 1e6]");
    }
    t.nodes.inter_node_byte_cost = c;
  }
  return t;
}

std::string with_topology(const std::string& config, const PlanTopology& topology) {
  if (!topology.given) return config;
  nlohmann::json c = nlohmann::json::parse(config, nullptr, false);
  if (c.is_discarded() || !c.is_object()) throw UsageError("--config is not a JSON object");
  // Keys the --config gives win: '{"ranks_per_node": R}' at R ranks plans blind (one node), reported by N.
  if (!c.contains("ranks_per_node")) c["ranks_per_node"] = topology.nodes.ranks_per_node;
  if (!c.contains("inter_node_byte_cost")) c["inter_node_byte_cost"] = topology.nodes.inter_node_byte_cost;
  return c.dump();
}

nlohmann::json topology_json(const PlanTopology& topology, int32_t ranks) {
  return {{"ranks_per_node", topology.nodes.ranks_per_node},
          {"inter_node_byte_cost", topology.nodes.inter_node_byte_cost},
          {"nodes", topology.nodes.num_nodes(ranks)}};
}

nlohmann::json node_bytes_json(const cad::plan::PlanStats& stats, const PlanTopology& topology) {
  const cad::plan::NodeBytes split = cad::plan::split_by_node(stats, topology.nodes);
  return {{"intra_node_bytes", split.intra_total},
          {"inter_node_bytes", split.inter_total},
          {"intra_node_bytes_sent", split.intra_sent},
          {"intra_node_bytes_received", split.intra_received},
          {"inter_node_bytes_sent", split.inter_sent},
          {"inter_node_bytes_received", split.inter_received}};
}

}  // namespace cad::cli
