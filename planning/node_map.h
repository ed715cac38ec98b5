// node_map.h -- which ranks share a node and what a byte that leaves its node costs: the topology the
// balancers price and `cad plan` reports (the one place this rule lives). Ranks of a node are
// consecutive, as launchers number them: ranks r and s share a node iff r / ranks_per_node ==
// s / ranks_per_node. ranks_per_node 0 (the default) puts every rank on one node: no byte leaves it,
// and every balancer plans as it did before it knew the topology.
#pragma once

#include <cstdint>
#include <vector>

#include "plan_model.h"

namespace cad::plan {

// What a byte that leaves its node costs against one that stays, by default. NOT MEASURED: the ratio of
// the links' nominal per-GPU bandwidths, NVLink 4 on H200 (~450 GB/s per direction) over 400 Gb/s
// InfiniBand (~50 GB/s), until the slow-link stand-ins of bench/nccl measure it (docs/slow_links.md).
constexpr double kDefaultInterNodeByteCost = 9.0;

struct NodeMap {
  int32_t ranks_per_node = 0;  // 0: one node holds every rank
  double inter_node_byte_cost = kDefaultInterNodeByteCost;

  int32_t node_of(int32_t rank) const { return ranks_per_node > 0 ? rank / ranks_per_node : 0; }
  bool same_node(int32_t a, int32_t b) const { return node_of(a) == node_of(b); }
  // True when `num_servers` servers span more than one node.
  bool multi_node(int32_t num_servers) const { return ranks_per_node > 0 && ranks_per_node < num_servers; }
  int32_t num_nodes(int32_t num_servers) const {
    return ranks_per_node > 0 ? (num_servers + ranks_per_node - 1) / ranks_per_node : 1;
  }
  // What `bytes` moved from rank `src` to server `dst` cost in units of a byte inside a node.
  double priced(int64_t bytes, int64_t inter_bytes) const {
    return static_cast<double>(bytes) + (inter_node_byte_cost - 1.0) * static_cast<double>(inter_bytes);
  }
};

// A plan's forward bytes (plan_model.h's link matrix) split by whether they stay in their node.
struct NodeBytes {
  std::vector<int64_t> intra_sent, intra_received;  // per rank/server: bytes on links inside its node
  std::vector<int64_t> inter_sent, inter_received;  // per rank/server: bytes to or from another node
  int64_t intra_total = 0;                          // every byte counted once (on its link)
  int64_t inter_total = 0;
};
NodeBytes split_by_node(const PlanStats& stats, const NodeMap& nodes);

}  // namespace cad::plan
