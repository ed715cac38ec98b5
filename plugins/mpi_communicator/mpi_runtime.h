// mpi_runtime.h -- the process-wide MPI lifetime, shared by every instance of the "mpi" plugin.
//
// MPI is a per-process singleton that can be initialised once and never again after MPI_Finalize, so
// this is the one piece of global state in the plugin. The rule:
//  - create() initialises MPI (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE) only if the process
//    has not done so; a host that initialised MPI itself keeps ownership of it.
//  - destroy() of the last live instance calls MPI_Finalize only if this plugin initialised MPI.
//    After that no instance can be created again in this process (create fails with a message
//    saying so). A host that creates instances one after another should keep one instance alive for
//    the whole run, or initialise and finalise MPI itself.
//  - a create that fails never finalises MPI (MPI_Finalize waits for every process, so finalising on
//    one rank's failure would block that rank until the others finish).
#pragma once

#include "plugin_support.h"

namespace cad::mpi_comm {

// Makes sure MPI is initialised. Throws Failure(CAD_STATUS_COMMUNICATION) if MPI was finalised.
void ensure_mpi_initialised(const plugin::Logger& logger);

// Counts a fully created instance. Call last in the instance's constructor.
void register_instance();

// Counts an instance fewer; finalises MPI if this plugin initialised it and none remain.
void unregister_instance(const plugin::Logger& logger);

}  // namespace cad::mpi_comm
