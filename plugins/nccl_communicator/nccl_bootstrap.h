// nccl_bootstrap.h -- how the ranks of an "nccl" communicator agree on rank, world size and the
// NCCL unique id before ncclCommInitRankConfig:
//  - "host": through the host's services->bootstrap_all_gather (rank and world from the services);
//  - "mpi":  through MPI_COMM_WORLD (MPI initialised if needed, by the rule in
//            plugins/mpi_communicator/mpi_runtime.h); only in builds with CAD_ENABLE_MPI;
//  - "auto": "host" when the host lends bootstrap_all_gather, else "mpi" when launched by an MPI
//            launcher (OMPI_COMM_WORLD_SIZE / PMI_SIZE / PMIX_RANK set), else a world of one rank.
#pragma once

#include <string>

#include <nccl.h>

#include "nccl_config.h"
#include "plugin_support.h"

namespace cad::nccl_comm {

struct Bootstrap {
  int rank = 0;
  int world_size = 1;
  ncclUniqueId id{};
  std::string method;  // "host", "mpi" or "single rank", for messages
};

// Collective over the ranks that will form the communicator. Throws Failure naming the method.
Bootstrap bootstrap(const NcclConfig& config, const cad_host_services_v1_t* services, const plugin::Logger& logger);

}  // namespace cad::nccl_comm
