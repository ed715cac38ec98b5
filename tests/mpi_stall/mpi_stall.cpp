// mpi_stall.cpp MODE -- one rank misbehaves, the others must end with the failure's message within
// the timeout plus a few seconds (issue 10). Run under mpirun by mpi_stall_test.sh, which checks the
// exit status, the output and the time. Like a host, it reports a failure only after it has destroyed
// its instances and the process unloads the plugin at exit -- the teardown that used to block in
// MPI_Finalize waiting for the stalled peer, so the message was never printed.
//   stop                rank 1 stops itself (SIGSTOP) before a barrier
//   exit-before-create  rank 1 exits, with status 0, before creating its communicator (MPI_Init in the
//                       others' create waited for it forever; a non-zero status lets mpirun end the job)
//   late-create         rank 1 creates a second communicator 8 s after the others (their create
//                       times out; the pending MPI_Comm_idup used to abort the job with MPI_ERR_REQUEST)
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "comm_plugin.h"

using cad::mpi_test::Comm;

namespace {

constexpr const char* kConfig = R"({"timeout_ms": 2000})";
constexpr int kMisbehaving = 1;

int world_rank_from_launcher() {
  const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
  return r != nullptr ? std::atoi(r) : 0;
}

// What failed; printed after teardown, as a host unwinding an exception would.
std::string failure;

void expect_ok(cad_status_t status, const Comm& c, const char* call, int rank) {
  if (status == CAD_STATUS_OK || !failure.empty()) return;
  failure = "rank " + std::to_string(rank) + ": " + call + " failed (" + std::to_string(status) + "): " +
            (c.ctx() != nullptr ? c.last_error() : c.create_error());
}

void run(const std::string& mode, const cad_communicator_v1_t* table, int rank) {
  if (mode == "exit-before-create" && rank == kMisbehaving) std::exit(0);
  Comm first(table, kConfig);
  expect_ok(first.create_status(), first, "create", rank);
  if (!failure.empty()) return;
  expect_ok(first.barrier(), first, "barrier", rank);
  if (mode == "stop") {
    if (rank == kMisbehaving) std::raise(SIGSTOP);
    expect_ok(first.barrier(), first, "barrier", rank);
  } else if (mode == "late-create") {
    if (rank == kMisbehaving) std::this_thread::sleep_for(std::chrono::seconds(8));
    Comm second(table, kConfig);
    expect_ok(second.create_status(), second, "create", rank);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpi_stall stop|exit-before-create|late-create\n");
    return 2;
  }
  const int rank = world_rank_from_launcher();
  run(argv[1], cad::mpi_test::communicator_table(CAD_MPI_PLUGIN_PATH), rank);
  if (!failure.empty()) {
    std::fprintf(stderr, "%s\n", failure.c_str());
    return 1;
  }
  std::printf("rank %d: no failure\n", rank);
  return 0;
}
