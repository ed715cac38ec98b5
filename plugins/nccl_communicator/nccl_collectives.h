// nccl_collectives.h -- the data calls of the "nccl" communicator: each enqueues on the caller's
// stream through GuardedComm::launch and returns before the transfer completes.
#pragma once

#include <cstdint>

#include "nccl_context.h"

namespace cad::nccl_comm {

void all_to_all_v(NcclContext& ctx, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                  void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, cudaStream_t stream);
void all_gather(NcclContext& ctx, const void* send, uint64_t bytes, void* recv, cudaStream_t stream);
void barrier(NcclContext& ctx, cudaStream_t stream);
// Collective: one byte to and from every other rank on a private stream, waited for (config connect_peers),
// so that NCCL connects every pair now instead of at the first all_to_all_v that uses it. A peer that never
// takes part is caught by the watchdog (timeout_ms), whose abort ends the wait; then this throws.
void connect_peers(NcclContext& ctx);

}  // namespace cad::nccl_comm
