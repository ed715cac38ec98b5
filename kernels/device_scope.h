// device_scope.h -- host-side helper shared by the GPU plugins: make a CUDA device current for a scope
// and give the caller's device back after it. The caller turns error() into its own failure.
#pragma once

#include <cuda_runtime.h>

namespace cad::kernels {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    error_ = cudaGetDevice(&previous_);
    if (error_ == cudaSuccess && previous_ != device) error_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t error() const { return error_; }

 private:
  int previous_ = 0;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace cad::kernels
