// anchor_main.cpp -- main() for the multi-rank gtest programs. It keeps one "anchor" communicator
// alive for the whole run, with a generous timeout, through which tests compare results across ranks
// and meet again after provoking a failure on an instance of their own.
#include "anchor.h"

#include <gtest/gtest.h>

namespace cad::mpi_test {
namespace {
Comm* g_anchor = nullptr;

class AnchorEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    g_anchor = new Comm(communicator_table(CAD_MPI_PLUGIN_PATH), R"({"timeout_ms": 30000})");
    ASSERT_EQ(g_anchor->create_status(), CAD_STATUS_OK) << g_anchor->create_error();
  }
  void TearDown() override {
    delete g_anchor;  // MPI itself is finalised later, when the plugin is unloaded at exit
    g_anchor = nullptr;
  }
};
}  // namespace

Comm& anchor() { return *g_anchor; }

std::vector<int32_t> gather_ints(int32_t value) {
  std::vector<int32_t> all(static_cast<size_t>(anchor().world()), -1);
  const cad_status_t s = anchor().all_gather(&value, sizeof(value), all.data());
  if (s != CAD_STATUS_OK) ADD_FAILURE() << "anchor all_gather failed: " << anchor().last_error();
  return all;
}

}  // namespace cad::mpi_test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new cad::mpi_test::AnchorEnvironment);
  return RUN_ALL_TESTS();
}
