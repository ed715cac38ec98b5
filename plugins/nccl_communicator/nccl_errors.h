// nccl_errors.h -- turning CUDA and NCCL results into plugin Failures with messages that say what
// failed and why (ncclGetErrorString plus ncclGetLastError's detail).
#pragma once

#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "device_scope.h"
#include "plugin_support.h"

namespace cad::nccl_comm {

inline std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && detail[0] != '\0') text += std::string(" (") + detail + ")";
  return text;
}

inline void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) {
    plugin::fail(CAD_STATUS_DEVICE_ERROR, what + " failed: " + cudaGetErrorName(status) + ": " +
                                              cudaGetErrorString(status));
  }
}

// Whether `stream` is being captured into a CUDA graph; `if_unknown` where CUDA cannot tell (its error is cleared).
inline bool stream_capturing(cudaStream_t stream, bool if_unknown) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();
    return if_unknown;
  }
  return capture != cudaStreamCaptureStatusNone;
}

// Makes `device` current for the scope of one call and gives the caller's device back afterwards
// (kernels/device_scope.h: the plugin must not change the host thread's current device behind its back, nor
// open a context on another GPU when giving it back); a failure to switch throws.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : scope_(device) {
    check_cuda(scope_.error(), "cudaSetDevice(" + std::to_string(device) + ")");
  }

 private:
  cad::kernels::DeviceScope scope_;
};

}  // namespace cad::nccl_comm
