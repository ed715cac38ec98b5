// demo_compare.h -- the agreement check of `cad demo`: every balancer's O, LSE, dQ, dK, dV against the
// first balancer's (the baseline), as the largest difference relative to the largest |value| over all
// ranks, so that every rank reaches the same verdict from the same gathered numbers.
#pragma once

#include <array>
#include <vector>

#include "demo_run.h"

namespace cad::demo {

// This rank's numbers for the check (kNumOutputs * runs.size() values): for each output the baseline's
// largest finite |x|, then for each later run and output the largest |x - baseline| (infinity where
// the two differ in a NaN or infinity).
std::vector<double> local_agreement(const std::vector<BalancerRun>& runs);

struct Verdict {
  // Per later run (index 0 is runs[1]), per output: max over ranks of |x - baseline| divided by max over
  // ranks of |baseline|.
  std::vector<std::array<double, kNumOutputs>> relative;
  double worst = 0;    // largest of them
  bool agree = true;   // worst <= tolerance (false for NaN)
};

// `per_rank[r]` is rank r's local_agreement.
Verdict judge(const std::vector<std::vector<double>>& per_rank, size_t runs, double tolerance);

// For the tests of the check itself: adds `relative` * max|O| to the first element of `run`'s O.
void inject_difference(BalancerRun& run, double relative);

}  // namespace cad::demo
