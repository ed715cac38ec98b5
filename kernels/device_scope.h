// device_scope.h -- host-side helper shared by the GPU plugins and the host adapter: make a CUDA device
// current for a scope and give the caller's device back after it. The caller turns error() into its own
// failure.
//
// Giving the device back must not open a context: since CUDA 12, cudaSetDevice initialises the device's
// primary context. A thread that never chose a device (a planning thread, a watchdog) reports device 0, and
// restoring that 0 would open a context on GPU 0 in every rank's process (about 0.5 GiB of GPU 0 each, which
// ran rank 0 out of memory on 4 GPUs). So the previous device is restored only where its primary context is
// already active; otherwise the thread keeps the scope's device, which is the one this process uses.
#pragma once

#include <cuda_runtime.h>

namespace cad::kernels {

// Whether `device`'s primary context exists in this process (asked through the driver entry point, so that
// nothing links libcuda and loading still works where no driver is installed). Unknown counts as active:
// then the caller's device is restored, as before.
inline bool primary_context_active(int device) {
  using GetState = int (*)(int, unsigned int*, int*);  // cuDevicePrimaryCtxGetState(CUdevice, flags, active)
  static GetState get_state = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<GetState>(nullptr);
    }
    return reinterpret_cast<GetState>(fn);
  }();
  if (get_state == nullptr) return true;
  unsigned int flags = 0;
  int active = 1;
  return get_state(device, &flags, &active) != 0 || active != 0;
}

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    error_ = cudaGetDevice(&previous_);
    if (error_ == cudaSuccess && previous_ != device) error_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_ && primary_context_active(previous_)) {
      cudaSetDevice(previous_);
    }
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return error_; }

 private:
  int previous_ = 0;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace cad::kernels
