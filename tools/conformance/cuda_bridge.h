// cuda_bridge.h -- the few CUDA runtime calls the kit needs, behind plain functions so that only
// cuda_bridge_cuda.cpp (compiled when CAD_ENABLE_CUDA) touches the CUDA runtime; a kit built without
// CUDA links cuda_bridge_nocuda.cpp, whose functions all report "kit built without CUDA".
// Internal to the kit. Every function returns false / nullptr on failure and sets *error.
#pragma once

#include <cstddef>
#include <string>

namespace cad::conformance::cuda {

// True if this kit was compiled with CUDA support.
bool built_with_cuda();

// Select `device` and allocate `bytes` of device memory; nullptr on failure.
void* allocate(int device, size_t bytes, std::string* error);
void release(void* ptr);
bool copy_to_device(void* dst, const void* src, size_t bytes, std::string* error);
bool copy_to_host(void* dst, const void* src, size_t bytes, std::string* error);
// Wait for all work on the device, including work enqueued on the legacy default stream.
bool synchronize(std::string* error);

}  // namespace cad::conformance::cuda
