// device_memory_cuda.cpp -- stream-ordered CUDA allocation for the CUDA build (cudaMallocAsync on the
// caller's stream, on the requested device; the caller's current device is restored).
#include <cuda_runtime_api.h>

#include "device_memory.h"

namespace cad::host {
namespace {

// Makes `device_id` current for the scope and restores the previous device.
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device_id) {
    ok_ = cudaGetDevice(&previous_) == cudaSuccess && cudaSetDevice(device_id) == cudaSuccess;
  }
  ~DeviceScope() {
    if (ok_) cudaSetDevice(previous_);
  }
  bool ok() const { return ok_; }

 private:
  int previous_ = 0;
  bool ok_ = false;
};

}  // namespace

bool cuda_allocation_supported() { return true; }

cad_status_t cuda_allocate(int32_t device_id, size_t bytes, void* stream, void** out, std::string* error) {
  DeviceScope scope(device_id);
  if (!scope.ok()) {
    *error = "allocate: cannot select CUDA device " + std::to_string(device_id);
    return CAD_STATUS_DEVICE_ERROR;
  }
  const cudaError_t status = cudaMallocAsync(out, bytes, static_cast<cudaStream_t>(stream));
  if (status == cudaSuccess) return CAD_STATUS_OK;
  cudaGetLastError();  // clear the sticky-free error state
  *error = "allocate: cudaMallocAsync of " + std::to_string(bytes) + " bytes on device " +
           std::to_string(device_id) + " failed: " + cudaGetErrorString(status);
  return status == cudaErrorMemoryAllocation ? CAD_STATUS_OUT_OF_MEMORY : CAD_STATUS_DEVICE_ERROR;
}

void cuda_free(int32_t device_id, void* ptr, void* stream) {
  DeviceScope scope(device_id);
  cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
}

}  // namespace cad::host
