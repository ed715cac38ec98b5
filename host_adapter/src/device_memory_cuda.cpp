// device_memory_cuda.cpp -- stream-ordered CUDA allocation for the CUDA build (cudaMallocAsync on the
// caller's stream, on the requested device; the caller's current device given back: kernels/device_scope.h).
#include <cuda_runtime_api.h>

#include "device_memory.h"
#include "device_scope.h"

namespace cad::host {
bool cuda_allocation_supported() { return true; }

cad_status_t cuda_allocate(int32_t device_id, size_t bytes, void* stream, void** out, std::string* error) {
  cad::kernels::DeviceScope scope(device_id);
  if (scope.error() != cudaSuccess) {
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
  cad::kernels::DeviceScope scope(device_id);
  cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
}

}  // namespace cad::host
