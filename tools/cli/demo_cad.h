// demo_cad.h -- `cad demo`'s CAD mode, the project's main job on CPU: one Pretrain batch over the
// communicator's ranks, forward and backward through CAD once per balancer (the same config, its
// balancer instance's plugin swapped), per-rank cost/bytes/times, and a check that every balancer gives
// the first one's results.
#pragma once

#include <string>
#include <vector>

#include "demo_batch.h"
#include "demo_run.h"
#include "demo_stack.h"

namespace cad::demo {

struct CadDemoOptions {
  std::string config;       // the file the stack came from (names it in errors, resolves plugin_path)
  std::string search_path;  // plugin directories searched first (may be empty)
  Shape shape;
  BatchOptions batch;
  std::vector<std::string> balancers;  // the first is the baseline the others are compared with
  double inject_difference = 0;        // > 0: perturb the last balancer's O on rank 0 (tests the check)
};

// Collective over the stack's communicator; returns the exit code (0: every balancer agrees).
int run_cad_demo(const CadDemoOptions& options, const CadStack& stack);

}  // namespace cad::demo
