// wire_device.h -- the CUDA data path's wires (wire.h), CUDA builds only.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "context.h"
#include "wire.h"

namespace cad::cad_plugin {

struct DevicePlan;  // device_plan.h

// The wire of one call on `stream`: StagedWire where the communicator works on host memory (ctx.host_staged, through
// `plan`'s pinned buffers), else DeviceWire. A DeviceWire destroyed with moves not yet joined joins their timing
// (never their data) so that the runtime's queue of timed exchanges does not stop at them.
std::unique_ptr<Wire> make_device_wire(CadContext& ctx, DevicePlan& plan, cudaStream_t stream);

}  // namespace cad::cad_plugin
