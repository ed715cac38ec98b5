// mpi_runtime.cpp -- see mpi_runtime.h for the initialise/finalise rule.
#include "mpi_runtime.h"

#include <cstdio>
#include <mutex>

#include <mpi.h>

namespace cad::mpi_comm {
namespace {

// Process-wide by necessity: MPI itself is process-wide (see mpi_runtime.h). Its destructor runs
// when the plugin is unloaded or the process exits, and finalises MPI if the plugin initialised it.
struct RuntimeState {
  std::mutex mutex;
  int live_instances = 0;
  bool initialised_by_plugin = false;
  ~RuntimeState() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!initialised_by_plugin || finalized) return;
    if (live_instances > 0) {
      std::fprintf(stderr, "cad 'mpi' plugin: finalising MPI at unload/exit with %d communicator(s) not "
                           "destroyed\n", live_instances);
    }
    MPI_Finalize();
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

}  // namespace

void ensure_mpi_initialised(const plugin::Logger& logger) {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
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
    // MULTIPLE because different instances may be used from different threads at the same time.
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) plugin::fail(CAD_STATUS_COMMUNICATION, "MPI_Init_thread failed");
    s.initialised_by_plugin = true;
    logger.debug(std::string("initialised MPI with ") + thread_level_name(provided));
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    logger.warn(std::string("MPI provides only ") + thread_level_name(provided) +
                ": use every 'mpi' communicator from the thread that initialised MPI");
  }
}

void register_instance() {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.live_instances;
}

void unregister_instance() {
  RuntimeState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  --s.live_instances;
}

}  // namespace cad::mpi_comm
