// cuda_check.h -- the CAD plugin's one rule for a failed CUDA call (CUDA builds only): clear CUDA's sticky
// last error and throw DEVICE_ERROR naming what failed and CUDA's reason.
#pragma once

#include <cuda_runtime.h>

#include "plugin_support.h"

namespace cad::cad_plugin {

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    plugin::fail(CAD_STATUS_DEVICE_ERROR,
                 plugin::format("cad: %s failed: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err)));
  }
}

}  // namespace cad::cad_plugin
