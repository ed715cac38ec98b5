// nccl_bootstrap.cpp -- see nccl_bootstrap.h.
#include "nccl_bootstrap.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#ifdef CAD_NCCL_WITH_MPI
#include <mpi.h>

#include "mpi_requests.h"
#include "mpi_runtime.h"
#endif

namespace cad::nccl_comm {

using plugin::fail;
using plugin::format;

namespace {

bool host_can_bootstrap(const cad_host_services_v1_t* services) {
  return services->bootstrap_all_gather != nullptr && services->bootstrap_world_size > 0 &&
         services->bootstrap_rank >= 0 && services->bootstrap_rank < services->bootstrap_world_size;
}

// NCCL cannot be unloaded once it has started threads: ncclGetUniqueId leaves a bootstrap root thread
// that waits until every rank has connected. A host unloads this plugin (and with it libnccl) after a
// failed create -- e.g. when its bootstrap_all_gather failed after rank 0 made the id -- and that
// thread then runs in unmapped code: the process segfaults moments later. So before the first NCCL
// call, the libnccl we are linked to is made RTLD_NODELETE: it stays loaded until the process exits.
void pin_nccl_library() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&ncclGetUniqueId), &info) != 0 && info.dli_fname != nullptr) {
      dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);  // never closed, on purpose
    }
  });
}

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

void new_unique_id(ncclUniqueId* id) {
  const ncclResult_t result = ncclGetUniqueId(id);
  if (result != ncclSuccess) {
    fail(CAD_STATUS_COMMUNICATION, std::string("bootstrap: ncclGetUniqueId failed: ") + ncclGetErrorString(result));
  }
}

bool all_zero(const ncclUniqueId& id) {
  static const ncclUniqueId zero{};
  return std::memcmp(&id, &zero, sizeof id) == 0;
}

// Rank 0 makes the id; everyone else contributes zeros; all take rank 0's block. Rank 0 joins the
// all-gather even when ncclGetUniqueId fails (with zeros), so that the other ranks are not left
// waiting in the host's collective: they see the all-zero block and fail too.
Bootstrap through_host(const cad_host_services_v1_t* services) {
  Bootstrap b;
  b.method = "host";
  b.rank = services->bootstrap_rank;
  b.world_size = services->bootstrap_world_size;
  ncclUniqueId mine{};
  std::string id_error;
  if (b.rank == 0) {
    const ncclResult_t made = ncclGetUniqueId(&mine);
    if (made != ncclSuccess) {
      mine = ncclUniqueId{};
      const char* detail = ncclGetLastError(nullptr);
      id_error = ncclGetErrorString(made);
      if (detail != nullptr && detail[0] != '\0') id_error += std::string(" (") + detail + ")";
    }
  }
  std::vector<ncclUniqueId> all(static_cast<size_t>(b.world_size));  // zeros, unless the host fills them
  const cad_status_t status = services->bootstrap_all_gather(services->host_ctx, &mine, sizeof(mine), all.data());
  if (!id_error.empty()) {
    fail(CAD_STATUS_COMMUNICATION, format("bootstrap (host): rank 0 of %d: ncclGetUniqueId failed: %s (the other "
                                          "ranks were sent zeros and fail too)", b.world_size, id_error.c_str()));
  }
  if (status != CAD_STATUS_OK) {
    fail(CAD_STATUS_COMMUNICATION, format("bootstrap (host): the host's bootstrap_all_gather failed with status %d "
                                          "(rank %d of %d)", status, b.rank, b.world_size));
  }
  b.id = all[0];
  if (all_zero(b.id)) {
    fail(CAD_STATUS_COMMUNICATION, format("bootstrap (host): rank %d of %d received no NCCL unique id from rank 0 "
                                          "(its block is all zeros): rank 0 could not make one (see its error), or "
                                          "the host's bootstrap_all_gather returned OK without filling recv",
                                          b.rank, b.world_size));
  }
  return b;
}

#ifdef CAD_NCCL_WITH_MPI
Bootstrap through_mpi(const NcclConfig& config, const plugin::Logger& logger) {
  mpi_comm::ensure_mpi_initialised(logger, config.timeout_ms);
  Bootstrap b;
  b.method = "mpi";
  // Our own duplicate, so that the broadcast never meets the host's messages on MPI_COMM_WORLD.
  MPI_Comm comm = MPI_COMM_NULL;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS) fail(CAD_STATUS_COMMUNICATION, "bootstrap: MPI_Comm_dup failed");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &b.rank);
  MPI_Comm_size(comm, &b.world_size);
  if (b.rank == 0) new_unique_id(&b.id);
  // Point-to-point from rank 0 under the deadline, so a rank that never creates cannot hang us.
  try {
    mpi_comm::RequestSet transfers(comm, "bootstrap (NCCL unique id over MPI)", sizeof(b.id));
    if (b.rank == 0) {
      for (int p = 1; p < b.world_size; ++p) transfers.send(&b.id, sizeof(b.id), p, 0);
    } else {
      transfers.receive(&b.id, sizeof(b.id), 0, 0);
    }
    transfers.wait_all("broadcast from rank 0", mpi_comm::Deadline::after_ms(config.timeout_ms));
  } catch (...) {
    MPI_Comm_free(&comm);
    throw;
  }
  MPI_Comm_free(&comm);
  return b;
}
#endif

}  // namespace

std::string choose_bootstrap(const NcclConfig& config, const cad_host_services_v1_t* services) {
  std::string method = config.bootstrap;
  if (method == "auto") method = host_can_bootstrap(services) ? "host" : launched_by_mpi() ? "mpi" : "single";
  if (method == "host" && !host_can_bootstrap(services)) {
    fail(CAD_STATUS_INVALID_CONFIG, "plugin 'nccl' config: key 'bootstrap' is \"host\" but the host lends no "
                                    "bootstrap_all_gather (or no valid bootstrap_rank/bootstrap_world_size)");
  }
#ifndef CAD_NCCL_WITH_MPI
  if (method == "mpi") {
    fail(CAD_STATUS_UNSUPPORTED, "plugin 'nccl' config: key 'bootstrap' is \"mpi\" but this build has no MPI "
                                 "(CAD_ENABLE_MPI=OFF)");
  }
#endif
  return method;
}

Bootstrap bootstrap(const std::string& method, const NcclConfig& config, const cad_host_services_v1_t* services,
                    const plugin::Logger& logger) {
  pin_nccl_library();
  if (method == "host") return through_host(services);
#ifdef CAD_NCCL_WITH_MPI
  if (method == "mpi") return through_mpi(config, logger);
#else
  (void)config;
#endif
  Bootstrap b;
  b.method = "single rank";
  new_unique_id(&b.id);
  logger.info("no host bootstrap and no MPI launcher: forming a communicator of one rank");
  return b;
}

}  // namespace cad::nccl_comm
