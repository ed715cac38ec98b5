// node_map.cpp -- see node_map.h.
#include "node_map.h"

namespace cad::plan {

NodeBytes split_by_node(const PlanStats& stats, const NodeMap& nodes) {
  const size_t n = static_cast<size_t>(stats.num_nodes);
  NodeBytes out;
  out.intra_sent.assign(n, 0);
  out.intra_received.assign(n, 0);
  out.inter_sent.assign(n, 0);
  out.inter_received.assign(n, 0);
  for (size_t s = 0; s < n; ++s) {
    for (size_t d = 0; d < n; ++d) {
      const int64_t b = stats.link_bytes[s * n + d];
      if (b == 0) continue;
      if (nodes.same_node(static_cast<int32_t>(s), static_cast<int32_t>(d))) {
        out.intra_sent[s] += b;
        out.intra_received[d] += b;
        out.intra_total += b;
      } else {
        out.inter_sent[s] += b;
        out.inter_received[d] += b;
        out.inter_total += b;
      }
    }
  }
  return out;
}

}  // namespace cad::plan
