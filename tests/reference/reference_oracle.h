// reference_oracle.h -- what the reference backend's test files share: the loaded plugin, and one forward and
// backward of a problem checked against the tests' fp64 attention (naive_attention.h).
#pragma once

#include "host_tensor.h"
#include "naive_attention.h"
#include "plugin_under_test.h"

namespace cad::testing {

// The reference plugin, loaded once for the test binary.
PluginUnderTest& reference_plugin();

// Runs `p` forward and backward on a fresh instance with inputs of `dtype` drawn from `seed`, and expects O,
// LSE, dQ, dK and dV within `tolerance` (relative) of the fp64 oracle computed from exactly those inputs
// (bf16-rounded where the tensors are bf16).
void expect_matches_oracle(const Problem& p, Dtype dtype, double tolerance, unsigned seed);

}  // namespace cad::testing
