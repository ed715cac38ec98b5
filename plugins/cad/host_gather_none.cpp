// host_gather_none.cpp -- host_gather.cpp's stand-in for builds without CUDA: a communicator on device memory
// is refused at its first all_gather (context creation refuses it with a CPU server backend before that).
#include "comm.h"
#include "plugin_support.h"

namespace cad::cad_plugin {

struct HostGatherStaging {};

void HostGatherStagingDeleter::operator()(HostGatherStaging* staging) const { delete staging; }

HostGatherStaging* make_host_gather_staging(int device) {
  plugin::fail(CAD_STATUS_UNSUPPORTED, plugin::format("cad: the communicator moves memory of CUDA device %d, but this "
                                                      "build has no CUDA (CAD_ENABLE_CUDA=OFF)", device));
}

void staged_all_gather(HostGatherStaging&, Comm&, const void*, uint64_t, void*) {}

}  // namespace cad::cad_plugin
