// mpi_runtime.cpp -- see mpi_runtime.h for the initialise/finalise rule.
#include "mpi_runtime.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace cad::mpi_comm {
namespace {

using Clock = std::chrono::steady_clock;

// The state MPI_Init on the helper thread shares with the thread waiting for it. Shared-owned: a
// helper stuck in MPI_Init outlives the create that gave up on it.
struct InitCall {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  int rc = MPI_SUCCESS;
  int provided = MPI_THREAD_SINGLE;
};

struct PendingDup {
  MPI_Request request;
  std::unique_ptr<MPI_Comm> comm;
};

// Process-wide by necessity: MPI itself is process-wide (see mpi_runtime.h). Its destructor runs
// when the plugin is unloaded or the process exits, and finalises MPI if the plugin initialised it.
struct RuntimeState {
  std::mutex mutex;
  int live_instances = 0;
  bool initialised_by_plugin = false;
  std::shared_ptr<InitCall> init_in_flight;  // set while (or after) MPI_Init did not return in time
  int64_t guard_timeout_ms = 0;
  std::vector<PendingDup> pending_dups;

  ~RuntimeState() {
    if (init_in_flight) {
      std::fprintf(stderr, "cad 'mpi' plugin: MPI_Init never completed (not every rank started); not finalising "
                           "MPI\n");
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!initialised_by_plugin || finalized) return;
    if (live_instances > 0) {
      std::fprintf(stderr, "cad 'mpi' plugin: finalising MPI at unload/exit with %d communicator(s) not "
                           "destroyed\n", live_instances);
    }
    if (!every_rank_arrived()) return;
    MPI_Finalize();
  }

  // Completes the adopted MPI_Comm_idup requests and `extra` (may be NULL) by `deadline`; on success
  // frees the duplicated communicators and forgets the requests. Called with the mutex held, or at exit.
  bool complete(MPI_Request* extra, Clock::time_point deadline) {
    std::vector<MPI_Request> requests;
    for (const PendingDup& p : pending_dups) requests.push_back(p.request);
    if (extra != nullptr) requests.push_back(*extra);
    for (int done = 0;;) {
      MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
      if (done) break;
      if (Clock::now() >= deadline) {
        // Testall may have completed (and nulled) some: keep the handles as they are now.
        for (size_t i = 0; i < pending_dups.size(); ++i) pending_dups[i].request = requests[i];
        if (extra != nullptr) *extra = requests.back();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (PendingDup& p : pending_dups) {
      if (*p.comm != MPI_COMM_NULL) MPI_Comm_free(p.comm.get());
    }
    pending_dups.clear();
    return true;
  }

  // The guard before MPI_Finalize (see mpi_runtime.h): a nonblocking barrier on MPI_COMM_WORLD plus
  // the adopted MPI_Comm_idup requests, all bounded by the largest timeout of any instance.
  bool every_rank_arrived() {
    MPI_Request barrier = MPI_REQUEST_NULL;
    MPI_Ibarrier(MPI_COMM_WORLD, &barrier);
    const int64_t wait_ms = std::max<int64_t>(guard_timeout_ms, 1000);
    if (complete(&barrier, Clock::now() + std::chrono::milliseconds(wait_ms))) return true;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "cad 'mpi' plugin: rank %d: not every rank reached exit within %lld ms; leaving MPI "
                         "unfinalised so that a stalled peer cannot block this process (the launcher ends the "
                         "job)\n", rank, static_cast<long long>(wait_ms));
    std::fflush(stderr);
    return false;
  }
};

RuntimeState& state() {
  static RuntimeState s;
  return s;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// MPI_Init_thread on a helper thread, waited for at most timeout_ms. Called with the state locked.
int initialise_bounded(RuntimeState& s, int64_t timeout_ms) {
  auto call = std::make_shared<InitCall>();
  std::thread([call] {
    // MULTIPLE because different instances may be used from different threads at the same time (and
    // this helper is not the thread that will use MPI).
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    std::lock_guard<std::mutex> lock(call->mutex);
    call->rc = rc;
    call->provided = provided;
    call->done = true;
    call->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(call->mutex);
  if (!call->done_cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return call->done; })) {
    s.init_in_flight = call;
    plugin::fail(CAD_STATUS_TIMEOUT,
                 plugin::format("create: MPI_Init did not complete within %lld ms: MPI_Init waits for every rank of "
                                "the job; did a rank exit or stall before creating its communicator?",
                                static_cast<long long>(timeout_ms)));
  }
  if (call->rc != MPI_SUCCESS) plugin::fail(CAD_STATUS_COMMUNICATION, "MPI_Init_thread failed");
  return call->provided;
}

}  // namespace

void ensure_mpi_initialised(const plugin::Logger& logger, int64_t timeout_ms) {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.init_in_flight) {
    plugin::fail(CAD_STATUS_TIMEOUT, "create: an earlier MPI_Init in this process never completed (a rank of the "
                                     "job did not start); MPI is unusable here");
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    plugin::fail(CAD_STATUS_COMMUNICATION,
                 s.initialised_by_plugin
                     ? "MPI was finalised when the 'mpi' plugin was unloaded, and MPI cannot be re-initialised in "
                       "this process; a host that reloads plugins must initialise and finalise MPI itself"
                     : "MPI was already finalised by the host, and MPI cannot be re-initialised");
  }
  int initialised = 0;
  MPI_Initialized(&initialised);
  int provided = MPI_THREAD_SINGLE;
  if (!initialised) {
    provided = initialise_bounded(s, timeout_ms);
    s.initialised_by_plugin = true;
    logger.debug(std::string("initialised MPI with ") + thread_level_name(provided));
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    logger.warn(std::string("MPI provides only ") + thread_level_name(provided) +
                ": use every 'mpi' communicator from one thread at a time, and initialise MPI in the host if "
                "it must be the thread that calls it");
  }
}

void register_instance(int64_t timeout_ms) {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.live_instances;
  s.guard_timeout_ms = std::max(s.guard_timeout_ms, timeout_ms);
}

void unregister_instance() {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  --s.live_instances;
}

void adopt_pending_dup(MPI_Request request, MPI_Comm* comm, int64_t timeout_ms) {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.pending_dups.push_back(PendingDup{request, std::unique_ptr<MPI_Comm>(comm)});
  s.guard_timeout_ms = std::max(s.guard_timeout_ms, timeout_ms);
}

void check_no_pending_dup() {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.pending_dups.empty()) return;
  plugin::fail(CAD_STATUS_COMMUNICATION,
               "create: an earlier create in this process timed out duplicating MPI_COMM_WORLD, and its "
               "MPI_Comm_idup is still pending; the ranks may disagree on the order of their collectives, so no "
               "further 'mpi' communicator can be created in this job (raise timeout_ms and restart it)");
}

}  // namespace cad::mpi_comm
