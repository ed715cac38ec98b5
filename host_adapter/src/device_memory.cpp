// device_memory.cpp -- see device_memory.h.
#include "device_memory.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace cad::host {

static constexpr size_t kAlignment = 256;  // the ABI promises at least 256-byte alignment

cad_status_t MemoryLedger::cuda_allocate_block(int32_t device_id, size_t bytes, void* stream, void** out,
                                               std::string* error) {
  if (allocator_.allocate == nullptr) return cuda_allocate(device_id, bytes, stream, out, error);
  const std::string what = std::to_string(bytes) + " bytes on CUDA device " + std::to_string(device_id);
  void* ptr = nullptr;
  const cad_status_t status = allocator_.allocate(allocator_.user, device_id, bytes, stream, &ptr);
  if (status != CAD_STATUS_OK) {
    *error = "allocate: the application's allocator (device_allocate) refused " + what + " (" +
             cad_status_name(status) + ")";
    return status;
  }
  if (ptr == nullptr) {
    *error = "allocate: the application's allocator (device_allocate) returned OK but no memory for " + what;
    return CAD_STATUS_DEVICE_ERROR;
  }
  if (reinterpret_cast<std::uintptr_t>(ptr) % kAlignment != 0) {
    // Plugins rely on the ABI's alignment (vector loads); a misaligned block would fault or corrupt later.
    allocator_.free(allocator_.user, device_id, ptr, bytes, stream);
    char address[32];
    std::snprintf(address, sizeof address, "%p", ptr);
    *error = "allocate: the application's allocator (device_allocate) returned " + std::string(address) + " for " +
             what + ", expected an address aligned to " + std::to_string(kAlignment) + " bytes; handed it back";
    return CAD_STATUS_DEVICE_ERROR;
  }
  *out = ptr;
  return CAD_STATUS_OK;
}

void MemoryLedger::cuda_free_block(int32_t device_id, void* ptr, size_t bytes, void* stream) {
  if (allocator_.free != nullptr) {
    allocator_.free(allocator_.user, device_id, ptr, bytes, stream);
  } else {
    cuda_free(device_id, ptr, stream);
  }
}

cad_status_t MemoryLedger::allocate(cad_device_v1_t device, size_t bytes, void* stream, void** out,
                                    std::string* error) {
  if (out == nullptr) {
    *error = "allocate: out is NULL";
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  if (bytes == 0) {
    *out = nullptr;
    return CAD_STATUS_OK;
  }
  void* ptr = nullptr;
  if (device.device_type == CAD_DEVICE_CPU) {
    if (stream != nullptr) {
      *error = "allocate: a CPU allocation takes no stream";
      return CAD_STATUS_INVALID_ARGUMENT;
    }
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    if (rounded < bytes || (ptr = std::aligned_alloc(kAlignment, rounded)) == nullptr) {
      *error = "allocate: out of CPU memory for " + std::to_string(bytes) + " bytes";
      return CAD_STATUS_OUT_OF_MEMORY;
    }
  } else if (device.device_type == CAD_DEVICE_CUDA) {
    const cad_status_t status = cuda_allocate_block(device.device_id, bytes, stream, &ptr, error);
    if (status != CAD_STATUS_OK) return status;
  } else {
    *error = "allocate: unknown device type " + std::to_string(device.device_type);
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  blocks_[ptr] = Block{device, bytes};
  *out = ptr;
  return CAD_STATUS_OK;
}

bool MemoryLedger::free(cad_device_v1_t device, void* ptr, void* stream) {
  if (ptr == nullptr) return true;
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = blocks_.find(ptr);
    if (it == blocks_.end() || it->second.device.device_type != device.device_type ||
        it->second.device.device_id != device.device_id) {
      return false;
    }
    bytes = it->second.bytes;
    blocks_.erase(it);
  }
  if (device.device_type == CAD_DEVICE_CPU) {
    std::free(ptr);
  } else {
    cuda_free_block(device.device_id, ptr, bytes, stream);
  }
  return true;
}

size_t MemoryLedger::release_all(size_t* bytes) {
  std::unordered_map<void*, Block> blocks;
  {
    // Freed outside the lock: the application's free may take locks of its own (Python's GIL).
    std::lock_guard<std::mutex> lock(mutex_);
    blocks.swap(blocks_);
  }
  const size_t count = blocks.size();
  *bytes = 0;
  for (const auto& [ptr, block] : blocks) {
    *bytes += block.bytes;
    if (block.device.device_type == CAD_DEVICE_CPU) {
      std::free(ptr);
    } else {
      cuda_free_block(block.device.device_id, ptr, block.bytes, nullptr);
    }
  }
  return count;
}

}  // namespace cad::host
