// split_plugin.cpp -- the "split" communicator's ABI table and entry symbol: its collectives on SplitContext, the
// entry points around them from plugins/common/communicator_table.h (no exception crosses the boundary).
#include "communicator_table.h"
#include "split_context.h"

namespace cad::split_comm {
namespace {

struct SplitOps {
  using Context = SplitContext;
  static cad_device_v1_t device(const Context& c) { return c.device(); }
  static void all_to_all_v(Context& c, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                           void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream) {
    c.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, stream);
  }
  static void all_gather(Context& c, const void* send, uint64_t bytes, void* recv, void* stream) {
    c.all_gather(send, bytes, recv, stream);
  }
  static void barrier(Context& c, void* stream) { c.barrier(stream); }
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_COMMUNICATOR,
    "split",
    "0.1.0",
    "Node-split communicator: pairs inside a node over one borrowed communicator, pairs across nodes over another",
    nullptr,
    &plugin::CommunicatorTable<SplitOps>::kTable,
    nullptr,
};

}  // namespace
}  // namespace cad::split_comm

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &cad::split_comm::kPlugin; }
