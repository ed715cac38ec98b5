// device_memory.cpp -- see device_memory.h.
#include "device_memory.h"

#include <cstdlib>

namespace cad::host {

static constexpr size_t kAlignment = 256;  // the ABI promises at least 256-byte alignment

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
    const cad_status_t status = cuda_allocate(device.device_id, bytes, stream, &ptr, error);
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
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = blocks_.find(ptr);
    if (it == blocks_.end() || it->second.device.device_type != device.device_type ||
        it->second.device.device_id != device.device_id) {
      return false;
    }
    blocks_.erase(it);
  }
  if (device.device_type == CAD_DEVICE_CPU) {
    std::free(ptr);
  } else {
    cuda_free(device.device_id, ptr, stream);
  }
  return true;
}

size_t MemoryLedger::release_all(size_t* bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t count = blocks_.size();
  *bytes = 0;
  for (const auto& [ptr, block] : blocks_) {
    *bytes += block.bytes;
    if (block.device.device_type == CAD_DEVICE_CPU) {
      std::free(ptr);
    } else {
      cuda_free(block.device.device_id, ptr, nullptr);
    }
  }
  blocks_.clear();
  return count;
}

}  // namespace cad::host
