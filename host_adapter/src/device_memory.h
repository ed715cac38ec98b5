// device_memory.h -- the allocation service the host lends its plugins: CPU memory (256-byte aligned)
// always; CUDA memory (stream-ordered) from the application's allocator when the host options lend one,
// else from cudaMallocAsync in a build with CUDA. Every block is recorded, so a bad free is reported
// instead of corrupting memory, and leaks are visible when the host is destroyed.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cad_host.h"

namespace cad::host {

// Implemented in device_memory_cuda.cpp (CUDA build) or device_memory_no_cuda.cpp (CPU build).
bool cuda_allocation_supported();
cad_status_t cuda_allocate(int32_t device_id, size_t bytes, void* stream, void** out, std::string* error);
void cuda_free(int32_t device_id, void* ptr, void* stream);

// The application's CUDA allocator (cad_host_options_v1_t.device_allocate / device_free), or none.
struct DeviceAllocator {
  cad_device_allocate_fn allocate = nullptr;
  cad_device_free_fn free = nullptr;
  void* user = nullptr;
};

class MemoryLedger {
 public:
  explicit MemoryLedger(const DeviceAllocator& allocator = {}) : allocator_(allocator) {}
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
  cad_status_t cuda_allocate_block(int32_t device_id, size_t bytes, void* stream, void** out, std::string* error);
  void cuda_free_block(int32_t device_id, void* ptr, size_t bytes, void* stream);

  const DeviceAllocator allocator_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
};

}  // namespace cad::host
