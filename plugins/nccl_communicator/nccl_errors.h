// nccl_errors.h -- turning CUDA and NCCL results into plugin Failures with messages that say what
// failed and why (ncclGetErrorString plus ncclGetLastError's detail).
#pragma once

#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

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

// Makes `device` current for the scope of one call and restores the caller's device afterwards
// (the plugin must not change the host thread's current device behind its back).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace cad::nccl_comm
