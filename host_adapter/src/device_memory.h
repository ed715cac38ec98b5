// device_memory.h -- the allocation service the host lends its plugins: CPU memory (256-byte aligned)
// always, CUDA memory (stream-ordered) only in a build with CUDA. Every block is recorded, so a bad
// free is reported instead of corrupting memory, and leaks are visible when the host is destroyed.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cad_common_v1.h"

namespace cad::host {

// Implemented in device_memory_cuda.cpp (CUDA build) or device_memory_no_cuda.cpp (CPU build).
bool cuda_allocation_supported();
cad_status_t cuda_allocate(int32_t device_id, size_t bytes, void* stream, void** out, std::string* error);
void cuda_free(int32_t device_id, void* ptr, void* stream);

class MemoryLedger {
 public:
  MemoryLedger() = default;
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  // On failure *error says why (to be logged; the ABI carries only the status).
  cad_status_t allocate(cad_device_v1_t device, size_t bytes, void* stream, void** out, std::string* error);
  // False (and nothing freed) if `ptr` is not a live block of `device`.
  bool free(cad_device_v1_t device, void* ptr, void* stream);
  // Frees whatever is still allocated; returns how many blocks and bytes that was.
  size_t release_all(size_t* bytes);

 private:
  struct Block {
    cad_device_v1_t device;
    size_t bytes;
  };
  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
};

}  // namespace cad::host
