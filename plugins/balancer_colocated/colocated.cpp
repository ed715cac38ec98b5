// colocated.cpp -- the "colocated" balancer: every piece is computed by the rank that holds it (plain
// data parallelism, no traffic). The baseline every other balancer is measured against.
#include "balancer_support.h"

namespace {

struct Colocated {
  static constexpr const char* kName = "colocated";
  static constexpr const char* kDescription = "each piece computed by its owner (data parallelism, no traffic)";

  explicit Colocated(cad::plugin::ConfigReader&) {}  // no keys

  cad::balancer::Tasks plan(const cad::balancer::Problem& problem, const cad::plugin::Logger&) const {
    return cad::balancer::colocated_tasks(problem);
  }
};

}  // namespace

CAD_BALANCER_PLUGIN(Colocated)
