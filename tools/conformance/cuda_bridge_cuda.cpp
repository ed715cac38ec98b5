// cuda_bridge_cuda.cpp -- cuda_bridge.h over the CUDA runtime API (compiled only with CAD_ENABLE_CUDA).
#include <cuda_runtime_api.h>

#include "cuda_bridge.h"

namespace cad::conformance::cuda {

namespace {
bool ok(cudaError_t status, const char* what, std::string* error) {
  if (status == cudaSuccess) return true;
  *error = std::string(what) + ": " + cudaGetErrorString(status);
  return false;
}
}  // namespace

bool built_with_cuda() { return true; }

void* allocate(int device, size_t bytes, std::string* error) {
  if (!ok(cudaSetDevice(device), "cudaSetDevice", error)) return nullptr;
  void* ptr = nullptr;
  if (!ok(cudaMalloc(&ptr, bytes == 0 ? 1 : bytes), "cudaMalloc", error)) return nullptr;
  return ptr;
}

void release(void* ptr) {
  if (ptr != nullptr) cudaFree(ptr);
}

bool copy_to_device(void* dst, const void* src, size_t bytes, std::string* error) {
  return ok(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device", error);
}

bool copy_to_host(void* dst, const void* src, size_t bytes, std::string* error) {
  return ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host", error);
}

bool synchronize(std::string* error) { return ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", error); }

}  // namespace cad::conformance::cuda
