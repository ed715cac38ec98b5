// demo_local.h -- `cad demo`'s local mode, for stacks whose attention instance computes locally (e.g.
// configs/reference.json): a random varlen batch (a few documents of random lengths summing to N tokens)
// forward and backward through the attention instance, with sizes, timings and checksums. Under mpirun
// every rank runs the whole batch.
#pragma once

#include <cstdint>
#include <string>

#include "demo_run.h"

namespace cad::demo {

struct LocalDemoOptions {
  std::string config;
  std::string search_path;
  int64_t tokens = 1024;
  Shape shape{8, 2, 64, true};
  uint64_t seed = 1;
};

int run_local_demo(const LocalDemoOptions& options);

}  // namespace cad::demo
