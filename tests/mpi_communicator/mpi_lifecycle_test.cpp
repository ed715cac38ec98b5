// mpi_lifecycle_test.cpp -- MPI's lifetime under the "mpi" plugin (rule in mpi_runtime.h): instances
// can be created and destroyed one after another (the plugin does not finalise MPI when the last one
// goes, since MPI cannot be re-initialised), and MPI is finalised when the plugin is unloaded at exit
// -- mpirun reports a failure if any rank exits without MPI_Finalize, which this program never calls.
#include <gtest/gtest.h>

#include "comm_plugin.h"

namespace cad::mpi_test {
namespace {

TEST(MpiLifecycle, InstancesCanBeCreatedAgainAfterAllWereDestroyed) {
  const cad_communicator_v1_t* table = communicator_table(CAD_MPI_PLUGIN_PATH);
  for (int round = 0; round < 3; ++round) {
    Comm c(table, R"({"timeout_ms": 20000})");
    ASSERT_EQ(c.create_status(), CAD_STATUS_OK) << "round " << round << ": " << c.create_error();
    const int32_t mine = 100 * round + c.rank();
    std::vector<int32_t> all(static_cast<size_t>(c.world()), -1);
    ASSERT_EQ(c.all_gather(&mine, sizeof(mine), all.data()), CAD_STATUS_OK) << c.last_error();
    for (int r = 0; r < c.world(); ++r) EXPECT_EQ(all[static_cast<size_t>(r)], 100 * round + r);
  }
}

TEST(MpiLifecycle, TwoInstancesAreIndependent) {
  const cad_communicator_v1_t* table = communicator_table(CAD_MPI_PLUGIN_PATH);
  Comm a(table, R"({"timeout_ms": 20000})");
  Comm b(table, R"({"timeout_ms": 20000})");
  ASSERT_EQ(a.create_status(), CAD_STATUS_OK) << a.create_error();
  ASSERT_EQ(b.create_status(), CAD_STATUS_OK) << b.create_error();
  // Each instance has its own duplicated communicator and tag sequence, so back-to-back collectives
  // on the two never take each other's messages.
  const int32_t on_a = 1000 + a.rank(), on_b = 2000 + b.rank();
  std::vector<int32_t> got_a(static_cast<size_t>(a.world())), got_b(static_cast<size_t>(b.world()));
  ASSERT_EQ(a.all_gather(&on_a, sizeof(on_a), got_a.data()), CAD_STATUS_OK) << a.last_error();
  ASSERT_EQ(b.all_gather(&on_b, sizeof(on_b), got_b.data()), CAD_STATUS_OK) << b.last_error();
  for (int r = 0; r < a.world(); ++r) {
    EXPECT_EQ(got_a[static_cast<size_t>(r)], 1000 + r);
    EXPECT_EQ(got_b[static_cast<size_t>(r)], 2000 + r);
  }
}

}  // namespace
}  // namespace cad::mpi_test
