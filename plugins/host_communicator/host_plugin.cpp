// host_plugin.cpp -- the "host" communicator's ABI table and entry symbol: its collectives on HostCommContext,
// the entry points around them from plugins/common/communicator_table.h (no exception crosses the boundary).
#include "communicator_table.h"
#include "host_context.h"

namespace cad::host_comm {
namespace {

struct HostOps {
  using Context = HostCommContext;
  static cad_device_v1_t device(const Context&) { return cad_device_v1_t{CAD_DEVICE_CPU, 0}; }
  static void all_to_all_v(Context& c, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                           void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream) {
    plugin::require_no_stream(stream, "host", "all_to_all_v");
    c.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  }
  static void all_gather(Context& c, const void* send, uint64_t bytes, void* recv, void* stream) {
    plugin::require_no_stream(stream, "host", "all_gather");
    c.all_gather(send, bytes, recv);
  }
  static void barrier(Context& c, void* stream) {
    plugin::require_no_stream(stream, "host", "barrier");
    c.barrier();
  }
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_COMMUNICATOR,
    "host",
    "0.1.0",
    "CPU communicator over the collectives the host lends (e.g. torch.distributed with gloo): no MPI launcher",
    nullptr,
    &plugin::CommunicatorTable<HostOps>::kTable,
    nullptr,
};

}  // namespace
}  // namespace cad::host_comm

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &cad::host_comm::kPlugin; }
