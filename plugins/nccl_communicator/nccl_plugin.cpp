// nccl_plugin.cpp -- the "nccl" communicator's ABI table and entry symbol: its collectives (nccl_collectives.h)
// on NcclContext, the entry points around them from plugins/common/communicator_table.h (no exception crosses
// the boundary).
#include "communicator_table.h"
#include "nccl_collectives.h"
#include "nccl_context.h"

namespace cad::nccl_comm {
namespace {

struct NcclOps {
  using Context = NcclContext;
  static cad_device_v1_t device(const Context& c) { return cad_device_v1_t{CAD_DEVICE_CUDA, c.device()}; }
  static void all_to_all_v(Context& c, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                           void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream) {
    nccl_comm::all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                            static_cast<cudaStream_t>(stream));
  }
  static void all_gather(Context& c, const void* send, uint64_t bytes, void* recv, void* stream) {
    nccl_comm::all_gather(c, send, bytes, recv, static_cast<cudaStream_t>(stream));
  }
  static void barrier(Context& c, void* stream) { nccl_comm::barrier(c, static_cast<cudaStream_t>(stream)); }
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_COMMUNICATOR,
    "nccl",
    "0.1.0",
    "CUDA communicator over NCCL: grouped send/recv on the caller's stream, watchdog timeouts",
    nullptr,
    &plugin::CommunicatorTable<NcclOps>::kTable,
    nullptr,
};

}  // namespace
}  // namespace cad::nccl_comm

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &cad::nccl_comm::kPlugin; }
