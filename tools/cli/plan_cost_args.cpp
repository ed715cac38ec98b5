// plan_cost_args.cpp -- see plan_cost_args.h.
#include "plan_cost_args.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace cad::cli {

cad_cost_params_v1_t plan_cost_params(const Args& args) {
  const int64_t heads = args.get_int("--heads", 32, 1, 4096);
  const int64_t kv_heads = args.get_int("--kv-heads", std::min<int64_t>(8, heads), 1, heads);
  if (heads % kv_heads != 0) throw UsageError("--heads must be a multiple of --kv-heads");
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof cost;
  cost.num_q_heads = static_cast<int32_t>(heads);
  cost.num_kv_heads = static_cast<int32_t>(kv_heads);
  cost.head_dim = static_cast<int32_t>(args.get_int("--head-dim", 128, 1, 4096));
  cost.bytes_per_element = static_cast<int32_t>(args.get_int("--bytes-per-element", 2, 1, 8));
  cost.causal = args.has("--noncausal") ? 0 : 1;
  cost.min_shard_tokens = args.get_int("--min-shard", 128, 0, INT64_MAX);
  cost.memory_cap_bytes = args.get_int("--memory-cap", 0, 0, INT64_MAX);
  cost.window_left = args.get_int("--window", -1, -1, INT64_MAX);
  cost.window_right = -1;
  if (cost.window_left >= 0) cost.window_flags = CAD_WINDOW_GIVEN;
  if (cost.window_left >= 0 && cost.causal == 0) {
    // What CAD refuses (plugins/cad/validate.cpp) is not planned here either: a plan for it would describe
    // a run that cannot happen.
    throw std::runtime_error("UNSUPPORTED: --window " + std::to_string(cost.window_left) +
                             " with --noncausal: CAD computes sliding windows with causal attention only (a CAD "
                             "stack refuses this window with CAD_STATUS_UNSUPPORTED)");
  }
  return cost;
}

}  // namespace cad::cli
