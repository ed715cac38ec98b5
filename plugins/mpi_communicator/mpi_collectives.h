// mpi_collectives.h -- the data calls of the "mpi" communicator, built on RequestSet so that every
// one of them returns (with CAD_STATUS_TIMEOUT) instead of hanging when a peer does not take part.
#pragma once

#include <cstdint>

#include "mpi_context.h"

namespace cad::mpi_comm {

void all_to_all_v(MpiContext& ctx, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                  void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs);
void all_gather(MpiContext& ctx, const void* send, uint64_t bytes, void* recv);
void barrier(MpiContext& ctx);

}  // namespace cad::mpi_comm
