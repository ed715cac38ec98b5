// cuda_check.h -- the CAD plugin's one rule for a failed CUDA call (CUDA builds only): clear CUDA's sticky
// last error and throw DEVICE_ERROR naming what failed and CUDA's reason; and a device scope that applies it.
#pragma once

#include <cuda_runtime.h>

#include "device_scope.h"
#include "plugin_support.h"

namespace cad::cad_plugin {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    plugin::fail(CAD_STATUS_DEVICE_ERROR,
                 plugin::format("cad: %s failed: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err)));
  }
}

// Makes `device` current for the scope of one call (kernels/device_scope.h); a failure to switch throws,
// naming the device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : scope_(device) {
    check_cuda(scope_.error(), plugin::format("selecting CUDA device %d", device).c_str());
  }

 private:
  cad::kernels::DeviceScope scope_;
};

}  // namespace cad::cad_plugin
