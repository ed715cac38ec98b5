// anchor.h -- the process-lifetime communicator of the multi-rank gtest programs (anchor_main.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "comm_plugin.h"

namespace cad::mpi_test {

Comm& anchor();
// Every rank's `value`, by rank, gathered over the anchor.
std::vector<int32_t> gather_ints(int32_t value);

inline const cad_communicator_v1_t* table() { return communicator_table(CAD_MPI_PLUGIN_PATH); }

}  // namespace cad::mpi_test
