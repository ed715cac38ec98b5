// balancer_names_test.cpp -- the `cad` command's balancer-name check (tools/cli/balancer_names.cpp): what a user
// reads when a --balancer/--balancers name does not resolve.
#include "balancer_names.h"

#include <gtest/gtest.h>

#include <string>

#include "cli_args.h"

namespace {

std::string usage_error_of(const std::string& name, const std::vector<std::string>& extra) {
  try {
    cad::cli::require_balancer("--balancers", name, CAD_TEST_EMPTY_DIR, extra);
  } catch (const cad::cli::UsageError& e) {
    return e.what();
  }
  return "(no usage error)";
}

TEST(BalancerNames, UnknownNameSuggestsTheNearestValidOne) {
  const std::string message = usage_error_of("prefix-aware", {});
  EXPECT_NE(message.find("unknown balancer 'prefix-aware' (did you mean 'prefix_aware'?)"), std::string::npos)
      << message;
}

// A valid name whose plugin file is in no searched directory (here a name valid for the caller only, so that no
// built plugin answers it): the message says where it was looked for, and does not suggest the name itself.
TEST(BalancerNames, KnownNameWithoutItsPluginSaysWhereItLooked) {
  const std::string message = usage_error_of("no_such_balancer", {"no_such_balancer"});
  EXPECT_NE(message.find("balancer 'no_such_balancer' is a known name but its plugin was not found"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("cad_no_such_balancer.so not found in " CAD_TEST_EMPTY_DIR), std::string::npos) << message;
  EXPECT_EQ(message.find("did you mean"), std::string::npos) << message;
}

}  // namespace
