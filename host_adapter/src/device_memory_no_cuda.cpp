// device_memory_no_cuda.cpp -- the CPU-only build: CUDA allocations are refused, and the library
// does not depend on the CUDA runtime.
#include "device_memory.h"

namespace cad::host {

bool cuda_allocation_supported() { return false; }

cad_status_t cuda_allocate(int32_t, size_t, void*, void**, std::string* error) {
  *error = "allocate: CUDA memory requested, but this host library was built without CUDA";
  return CAD_STATUS_UNSUPPORTED;
}

void cuda_free(int32_t, void*, void*) {}

}  // namespace cad::host
