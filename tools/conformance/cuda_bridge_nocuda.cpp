// cuda_bridge_nocuda.cpp -- cuda_bridge.h for a kit built without CUDA: every call refuses.
#include "cuda_bridge.h"

namespace cad::conformance::cuda {

namespace {
constexpr const char* kNoCuda = "kit built without CUDA";
}

bool built_with_cuda() { return false; }

void* allocate(int, size_t, std::string* error) {
  *error = kNoCuda;
  return nullptr;
}

void release(void*) {}

bool copy_to_device(void*, const void*, size_t, std::string* error) {
  *error = kNoCuda;
  return false;
}

bool copy_to_host(void*, const void*, size_t, std::string* error) {
  *error = kNoCuda;
  return false;
}

bool synchronize(std::string* error) {
  *error = kNoCuda;
  return false;
}

}  // namespace cad::conformance::cuda
