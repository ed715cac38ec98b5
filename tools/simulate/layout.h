// layout.h -- the parallel layout `cad simulate` places a model on: GPUs, GPUs per node, tensor- and
// pipeline-parallel sizes. Data-parallel ranks (the units CAD balances across) = gpus / (tp * pp); the
// tensor-parallel group of a data-parallel rank sits inside one node (Megatron order: tp fastest, then
// dp, then pp), and each of its GPUs serves the attention of heads / tp query heads.
#pragma once

#include <cstdint>

#include "model_shape.h"

namespace cad::simulate {

struct Layout {
  int64_t gpus = 0;
  int64_t gpus_per_node = 8;
  int64_t tp = 1;
  int64_t pp = 1;
  // How a GPU's bytes to other nodes reach the network (`--nic-share`). false ("gpu"): over its own NIC, so a GPU
  // that sends much across is the bottleneck whatever its node-mates send. true ("node", NCCL's PXN on a
  // rail-optimised cluster): a byte to GPU b of another node first crosses NVLink to the GPU of the sender's node
  // on b's rail (same index in its node) and leaves over that GPU's NIC, so each NIC carries what its node sends
  // to its rail, and a node's cross-node bytes, not one GPU's, set the time. Bytes arrive at b's own NIC either way.
  bool rail_routed = false;

  int64_t dp() const { return gpus / (tp * pp); }
  // The node of data-parallel rank `d` within one pipeline stage (what decides whether a byte between
  // two ranks crosses the network).
  int64_t node_of(int64_t d) const { return d * tp / gpus_per_node; }
  // Its index within the node among the data-parallel ranks there: the rail its TP slice's GPUs sit on.
  int64_t rail_of(int64_t d) const { return d % (gpus_per_node / tp); }
};

// Refuses impossible layouts with std::invalid_argument naming the option and what was expected:
// tp * pp more than gpus (checked without forming a product that could wrap), gpus not a multiple of tp * pp, tp larger than a node or not dividing it, heads or KV heads not
// divisible among tp GPUs, layers not divisible among pp stages.
void validate(const Layout& layout, const ModelShape& shape);

// The attention shape one GPU computes: query heads / tp, KV heads / tp (at least 1: replicated when
// tp > kv_heads).
int64_t heads_per_gpu(const Layout& layout, const ModelShape& shape);
int64_t kv_heads_per_gpu(const Layout& layout, const ModelShape& shape);

}  // namespace cad::simulate
