// split_stream_cuda.cpp -- StreamFork with the CUDA runtime: a non-blocking side stream and two events
// without timing, made once per instance; fork and join only enqueue (no host wait).
#include "split_stream.h"

#include <cuda_runtime.h>

#include "plugin_support.h"

namespace cad::split_comm {

namespace {

void check(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) {
    plugin::fail(CAD_STATUS_DEVICE_ERROR, plugin::format("plugin 'split': %s failed: %s", call, cudaGetErrorString(rc)));
  }
}

// Makes `device` current for the life of the guard, as the side stream must live on the instance's GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace

StreamFork::StreamFork(int device) {
  DeviceGuard guard(device);
  cudaStream_t side = nullptr;
  cudaEvent_t forked = nullptr, joined = nullptr;
  check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  side_ = side;
  const cudaError_t a = cudaEventCreateWithFlags(&forked, cudaEventDisableTiming);
  if (a == cudaSuccess) forked_ = forked;
  const cudaError_t b = a == cudaSuccess ? cudaEventCreateWithFlags(&joined, cudaEventDisableTiming) : a;
  if (b == cudaSuccess) joined_ = joined;
  if (a != cudaSuccess || b != cudaSuccess) {
    if (forked_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(forked_));
    cudaStreamDestroy(side);
    check(a != cudaSuccess ? a : b, "cudaEventCreateWithFlags");
  }
}

StreamFork::~StreamFork() {
  // Destroying a stream or event with work pending is allowed: CUDA releases them once the work completes.
  if (joined_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(joined_));
  if (forked_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(forked_));
  if (side_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(side_));
}

void* StreamFork::fork(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(forked_), static_cast<cudaStream_t>(stream)), "cudaEventRecord (fork)");
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(side_), static_cast<cudaEvent_t>(forked_), 0),
        "cudaStreamWaitEvent (fork)");
  return side_;
}

void StreamFork::join(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(joined_), static_cast<cudaStream_t>(side_)), "cudaEventRecord (join)");
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(joined_), 0),
        "cudaStreamWaitEvent (join)");
}

}  // namespace cad::split_comm
