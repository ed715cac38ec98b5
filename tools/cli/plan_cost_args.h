// plan_cost_args.h -- the cost-model options of every `cad plan` mode, read in one place: --heads, --kv-heads,
// --head-dim, --bytes-per-element, --noncausal, --min-shard, --memory-cap and --window, with one set of
// defaults and one set of refusals (a window with --noncausal is refused as CAD refuses it), so that the
// batch modes (per-rank buffers, documents longer than a rank) cannot drift apart.
#pragma once

#include "cad_balancer_v1.h"
#include "cli_args.h"

namespace cad::cli {

// Throws UsageError naming the option, or std::runtime_error("UNSUPPORTED: ...") for what CAD refuses.
cad_cost_params_v1_t plan_cost_params(const Args& args);

}  // namespace cad::cli
