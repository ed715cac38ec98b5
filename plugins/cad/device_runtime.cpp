// device_runtime.cpp -- see device_runtime.h.
#include "device_runtime.h"

#include <memory>

#include "cuda_check.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

DeviceRuntime& runtime(CadContext& ctx, int device) {
  if (ctx.device && ctx.device->device == device) return *ctx.device;
  if (ctx.device) fail(CAD_STATUS_INVALID_ARGUMENT, format("cad: this instance runs on CUDA device %d, not %d",
                                                           ctx.device->device, device));
  auto rt = std::unique_ptr<DeviceRuntime, DeviceRuntimeDeleter>(new DeviceRuntime);
  rt->device = device;
  // The highest priority the device offers: when the exchange's kernels become ready while the caller's (or
  // the other nano-batch's) compute kernels fill the GPU, the block scheduler gives the exchange the next free
  // SMs instead of queueing it behind the compute; otherwise the exchange that ping-pong wants to hide is the
  // one that waits. Config comm_stream_priority "normal" keeps the default priority instead.
  int least_priority = 0, greatest_priority = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority), "cudaDeviceGetStreamPriorityRange");
  const int priority = ctx.config.comm_stream_highest_priority ? greatest_priority : 0;
  check_cuda(cudaStreamCreateWithPriority(&rt->comm_stream, cudaStreamNonBlocking, priority),
             "creating the communication stream");
  check_cuda(cudaEventCreateWithFlags(&rt->ready, cudaEventDisableTiming), "cudaEventCreate");
  check_cuda(cudaEventCreateWithFlags(&rt->done, cudaEventDisableTiming), "cudaEventCreate");
  ctx.device = std::move(rt);
  return *ctx.device;
}

void DeviceRuntimeDeleter::operator()(DeviceRuntime* runtime) const { delete runtime; }

}  // namespace cad::cad_plugin
