// mpi_runtime.h -- the process-wide MPI lifetime, shared by every instance of the "mpi" plugin.
//
// MPI is a per-process singleton that can be initialised once and never again after MPI_Finalize, so
// this is the one piece of global state in the plugin. The rule:
//  - create() initialises MPI (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE) only if the process
//    has not done so; a host that initialised MPI itself keeps ownership of it and finalises it.
//  - if this plugin initialised MPI, it finalises it when the plugin is unloaded (dlclose) or the
//    process exits, whichever comes first -- never at destroy(). Finalising when the last instance
//    goes would forbid the ordinary create, destroy, create again sequence (the conformance kit and
//    any host that rebuilds its stack do that), because MPI cannot be re-initialised.
//  - consequently, after the plugin was unloaded, loading it again in the same process cannot create
//    instances: create fails with a message saying so. Hosts that reload plugins should initialise
//    and finalise MPI themselves.
//  - MPI_Finalize waits for every process of the job, so every rank should reach exit (or unload).
#pragma once

#include "plugin_support.h"

namespace cad::mpi_comm {

// Makes sure MPI is initialised. Throws Failure(CAD_STATUS_COMMUNICATION) if MPI was finalised.
void ensure_mpi_initialised(const plugin::Logger& logger);

// Counts live instances (for the diagnostics at finalise time).
void register_instance();
void unregister_instance();

}  // namespace cad::mpi_comm
