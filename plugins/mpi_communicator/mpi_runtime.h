// mpi_runtime.h -- the process-wide MPI lifetime, shared by every instance of the "mpi" plugin.
//
// MPI is a per-process singleton that can be initialised once and never again after MPI_Finalize, so
// this is the one piece of global state in the plugin. The rule:
//  - create() initialises MPI (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE) only if the process
//    has not done so; a host that initialised MPI itself keeps ownership of it and finalises it.
//    MPI_Init waits for every rank of the job (OpenMPI's modex fence), so it runs on a helper thread
//    and create() gives up after the instance's timeout_ms: a rank that exits before creating its
//    communicator ends the others' create with CAD_STATUS_TIMEOUT instead of a hang.
//  - if this plugin initialised MPI, it finalises it when the plugin is unloaded (dlclose) or the
//    process exits, whichever comes first -- never at destroy(). Finalising when the last instance
//    goes would forbid the ordinary create, destroy, create again sequence (the conformance kit and
//    any host that rebuilds its stack do that), because MPI cannot be re-initialised.
//  - consequently, after the plugin was unloaded, loading it again in the same process cannot create
//    instances: create fails with a message saying so. Hosts that reload plugins should initialise
//    and finalise MPI themselves.
//  - MPI_Finalize waits for every process of the job, so a stalled peer would block the exit of every
//    other rank, after a timeout had already been reported. Finalisation is therefore guarded: every
//    rank first enters a nonblocking barrier and waits for it at most the largest timeout_ms of any
//    instance; only if every rank arrived does it call MPI_Finalize. Otherwise it writes why to stderr
//    and leaves MPI unfinalised: the process exits with its own status and the launcher (mpirun) ends
//    the job, stalled peers included. Teardown never blocks on a peer.
#pragma once

#include <cstdint>

#include <mpi.h>

#include "plugin_support.h"

namespace cad::mpi_comm {

// Makes sure MPI is initialised, waiting at most `timeout_ms` for MPI_Init. Throws
// Failure(CAD_STATUS_COMMUNICATION) if MPI was finalised, Failure(CAD_STATUS_TIMEOUT) if MPI_Init did
// not return in time (it may still be running; later creates fail at once).
void ensure_mpi_initialised(const plugin::Logger& logger, int64_t timeout_ms);

// Counts live instances (for the diagnostics at finalise time) and remembers the largest timeout,
// which bounds the barrier before MPI_Finalize.
void register_instance(int64_t timeout_ms);
void unregister_instance();

// Takes over an MPI_Comm_idup that timed out in create. Its request cannot be freed or cancelled (it
// is a collective; freeing it aborted the job with MPI_ERR_REQUEST), and MPI writes the new
// communicator into `*comm` when it completes, so the runtime keeps both alive until finalisation,
// which completes and frees them if every rank got there, and otherwise leaves them alone.
void adopt_pending_dup(MPI_Request request, MPI_Comm* comm, int64_t timeout_ms);

// Throws Failure(CAD_STATUS_COMMUNICATION) if a create of this process timed out in MPI_Comm_idup
// before. Its request is still pending, and OpenMPI does not reliably complete a later MPI_Comm_idup
// while an earlier one is outstanding (seen: it completed on some ranks and never on others); and
// whether the other ranks' creates timed out too is unknown, so the order of collectives on
// MPI_COMM_WORLD can no longer be trusted. Every later create fails at once, with this reason.
void check_no_pending_dup();

}  // namespace cad::mpi_comm
