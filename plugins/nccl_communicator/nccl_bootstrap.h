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

// The method `config` selects with these services: "host", "mpi" or "single". Local (no CUDA, no
// communication), so that a config that cannot work here is refused before anything else is touched:
// INVALID_CONFIG for "host" without a usable bootstrap_all_gather, UNSUPPORTED for "mpi" in a build
// without MPI.
std::string choose_bootstrap(const NcclConfig& config, const cad_host_services_v1_t* services);

// Collective over the ranks that will form the communicator, by `method` (from choose_bootstrap).
// Throws Failure naming the method. Through "host", every rank joins the all-gather exactly once,
// even rank 0 when it cannot make the NCCL unique id (it then sends zeros, which every rank refuses),
// so that no rank is left waiting in the host's all-gather for a rank that already gave up.
Bootstrap bootstrap(const std::string& method, const NcclConfig& config, const cad_host_services_v1_t* services,
                    const plugin::Logger& logger);

}  // namespace cad::nccl_comm
