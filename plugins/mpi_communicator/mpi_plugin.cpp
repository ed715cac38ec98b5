// mpi_plugin.cpp -- the "mpi" communicator's ABI table and entry symbol: its collectives (mpi_collectives.h) on
// MpiContext, the entry points around them from plugins/common/communicator_table.h (no exception crosses the
// boundary).
#include "communicator_table.h"
#include "mpi_collectives.h"
#include "mpi_context.h"

namespace cad::mpi_comm {
namespace {

struct MpiOps {
  using Context = MpiContext;
  static cad_device_v1_t device(const Context&) { return cad_device_v1_t{CAD_DEVICE_CPU, 0}; }
  static void all_to_all_v(Context& c, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                           void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream) {
    plugin::require_no_stream(stream, "mpi", "all_to_all_v");
    mpi_comm::all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  }
  static void all_gather(Context& c, const void* send, uint64_t bytes, void* recv, void* stream) {
    plugin::require_no_stream(stream, "mpi", "all_gather");
    mpi_comm::all_gather(c, send, bytes, recv);
  }
  static void barrier(Context& c, void* stream) {
    plugin::require_no_stream(stream, "mpi", "barrier");
    mpi_comm::barrier(c);
  }
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_COMMUNICATOR,
    "mpi",
    "0.1.0",
    "CPU communicator over OpenMPI: nonblocking point-to-point with deadlines, byte-count agreement",
    nullptr,
    &plugin::CommunicatorTable<MpiOps>::kTable,
    nullptr,
};

}  // namespace
}  // namespace cad::mpi_comm

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &cad::mpi_comm::kPlugin; }
