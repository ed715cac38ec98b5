// mpi_context.cpp -- creating and destroying one "mpi" communicator instance.
#include "mpi_context.h"

#include <algorithm>
#include <memory>
#include <thread>

#include "mpi_requests.h"
#include "mpi_runtime.h"

namespace cad::mpi_comm {

using plugin::fail;
using plugin::format;

static void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) fail(CAD_STATUS_COMMUNICATION, format("create: %s failed: %s", what, mpi_error_text(rc).c_str()));
}

MpiContext::MpiContext(const cad_host_services_v1_t* services, const char* config_json)
    : logger_(services, "mpi"), config_(read_config(config_json, logger_)) {
  ensure_mpi_initialised(logger_, config_.timeout_ms);
  try {
    create_communicator();
  } catch (...) {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    throw;
  }
  register_instance(config_.timeout_ms);  // last: only fully created instances are counted
}

void MpiContext::create_communicator() {
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);

  // Our own duplicate, so that our messages never mix with the host's and errors return to us
  // instead of aborting the job. MPI_Comm_idup lets a rank that never joins time out here too.
  // MPI writes the new communicator into *dup when the request completes, possibly after we gave up:
  // it lives on the heap so that the runtime can keep it (and the request) after a timeout.
  check_no_pending_dup();
  auto dup = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, dup.get(), &request), "MPI_Comm_idup(MPI_COMM_WORLD)");
  const Deadline deadline = Deadline::after_ms(config_.timeout_ms);
  int done = 0;
  for (int polls = 0;; ++polls) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Comm_idup(MPI_COMM_WORLD)");
    if (done || Clock::now() >= deadline.at) break;
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));  // oversubscribed nodes
    else std::this_thread::yield();
  }
  if (!done) {
    // A collective's request can be neither cancelled nor freed (MPI_Request_free aborted the job with
    // MPI_ERR_REQUEST): the runtime keeps it and completes it, or not, in the guarded finalisation.
    adopt_pending_dup(request, dup.release(), config_.timeout_ms);
    const std::string message =
        format("create: rank %d: duplicating MPI_COMM_WORLD (MPI_Comm_idup) timed out after %lld ms; is every one "
               "of the %d ranks creating this communicator?", world_rank,
               static_cast<long long>(config_.timeout_ms), world_size);
    logger_.log(CAD_LOG_ERROR, message);
    fail(CAD_STATUS_TIMEOUT, message);
  }
  comm_ = *dup;
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");

  if (config_.use_split) {
    const int key = config_.split_key_given ? config_.split_key : world_rank;
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, config_.split_color, key, &sub), "MPI_Comm_split");
    MPI_Comm_free(&comm_);
    comm_ = sub;
  } else if (!config_.ranks.empty()) {
    for (int r : config_.ranks) {
      if (r >= world_size) {
        fail(CAD_STATUS_INVALID_CONFIG, format("plugin 'mpi' config: key 'ranks': rank %d is not below the world "
                                               "size %d", r, world_size));
      }
    }
    if (std::find(config_.ranks.begin(), config_.ranks.end(), world_rank) == config_.ranks.end()) {
      fail(CAD_STATUS_INVALID_CONFIG, format("plugin 'mpi' config: key 'ranks': this process (world rank %d) is not "
                                             "listed; only the listed ranks may create this communicator",
                                             world_rank));
    }
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &world_group);
    MPI_Group_incl(world_group, static_cast<int>(config_.ranks.size()), config_.ranks.data(), &group);
    MPI_Comm sub = MPI_COMM_NULL;
    const int rc = MPI_Comm_create_group(comm_, group, /*tag=*/0, &sub);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    check_mpi(rc, "MPI_Comm_create_group");
    MPI_Comm_free(&comm_);
    comm_ = sub;
  }
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &world_size_);

  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub != nullptr) tag_limit_ = *tag_ub;
  logger_.debug(format("rank %d of %d (world rank %d of %d), timeout %lld ms", rank_, world_size_, world_rank,
                       world_size, static_cast<long long>(config_.timeout_ms)));
}

MpiContext::~MpiContext() {
  // MPI_Comm_free only marks the communicator for release; it does not wait for peers, so it is safe
  // after a timeout too. (After MPI_Finalize -- an instance outliving the plugin's unload -- no MPI
  // call is allowed any more.)
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  unregister_instance();
}

int MpiContext::next_tag_base() {
  const uint64_t slots = static_cast<uint64_t>(tag_limit_ / kTagsPerCall);
  return static_cast<int>((calls_++ % slots) * kTagsPerCall);
}

void MpiContext::mark_broken(const std::string& reason) {
  if (broken_reason_.empty()) logger_.log(CAD_LOG_ERROR, format("rank %d of %d: %s", rank_, world_size_, reason.c_str()));
  broken_reason_ = reason;
}

void MpiContext::check_usable() const {
  if (!broken_reason_.empty()) {
    fail(CAD_STATUS_COMMUNICATION, "this communicator is unusable after an earlier failure (" + broken_reason_ +
                                       "); only last_error and destroy may be called");
  }
}

}  // namespace cad::mpi_comm
