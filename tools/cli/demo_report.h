// demo_report.h -- what `cad demo`'s CAD mode prints at the end (rank 0 only): per rank its tokens and,
// under every balancer, its attention cost, bytes sent/received and server compute time; per balancer
// the imbalance, bytes moved and times; and the agreement verdict, which every rank returns as its exit
// code.
#pragma once

#include <vector>

#include "demo_batch.h"
#include "demo_run.h"

namespace cad::demo {

constexpr double kAgreementTolerance = 1e-5;  // fp32, relative to the largest |value| (DESIGN.md)

// Collective: gathers every rank's times and agreement numbers through `comm`, prints on rank 0, and
// returns 0 on every rank if all balancers agree with the first, 1 otherwise.
int report(const Communicator& comm, const Batch& batch, const std::vector<BalancerRun>& runs);

}  // namespace cad::demo
