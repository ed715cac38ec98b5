// device_memory.h -- the device memory of CAD's CUDA data path (CUDA builds only): buffers from the host's
// allocate service, handed back in stream order; the memory one call works in (CallScratch); and a forward's server
// batch kept for its backward (DeviceSaved). Where each buffer lives and for how long: plugins/cad/README.md.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "context.h"

namespace cad::cad_plugin {

// Device memory from the host's allocate service, handed back in stream order on `stream`.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
};

// Throws OUT_OF_MEMORY naming `what` when the host cannot allocate; zero bytes is a NULL buffer.
DeviceBuffer allocate(CadContext& ctx, int device, size_t bytes, void* stream, const char* what);
void release(CadContext& ctx, int device, DeviceBuffer& b, void* stream);

// The device memory one call works in: each exchange's send and receive buffers and the server batch's scratch,
// from the host's allocator on the call's stream, given back in that stream's order where the call no longer needs
// them or when it ends. Every exchange on the communication stream is joined back to the call's
// stream before the call returns, so that stream-ordered release cannot hand memory to later work too early.
class CallScratch {
 public:
  CallScratch(CadContext& ctx, int device, void* stream) : ctx_(ctx), device_(device), stream_(stream) {}
  CallScratch(const CallScratch&) = delete;
  CallScratch& operator=(const CallScratch&) = delete;
  ~CallScratch() {
    for (DeviceBuffer& b : owned_) release(ctx_, device_, b, stream_);
  }

  void* take(size_t bytes, const char* what) {
    owned_.push_back(allocate(ctx_, device_, bytes, stream_, what));
    count(bytes);
    return owned_.back().ptr;
  }
  // Gives one buffer from take() back now, where the rest of the call no longer needs it (in stream order:
  // the work enqueued on it so far runs first).
  void give_back(void* ptr) {
    for (DeviceBuffer& b : owned_) {
      if (b.ptr == ptr && ptr != nullptr) {
        live_ -= b.bytes;
        release(ctx_, device_, b, stream_);
      }
    }
  }
  int64_t peak_bytes() const { return static_cast<int64_t>(peak_); }

 private:
  void count(size_t bytes) {
    live_ += bytes;
    peak_ = std::max(peak_, live_);
  }
  CadContext& ctx_;
  int device_;  // the call's CUDA device
  void* stream_;
  std::vector<DeviceBuffer> owned_;
  size_t live_ = 0, peak_ = 0;  // bytes held now and at most during the call
};

struct DeviceSaved {
  int device = 0;
  void* stream = nullptr;  // the stream of the last call that used it
  DeviceBuffer q, k, v, o, lse;
  // The owner's own tensors for the tasks it runs in place (its backward may be handed stand-ins for q/k/v/o).
  DeviceBuffer own_q, own_k, own_v, own_o, own_lse;
  std::array<DeviceBuffer*, 10> buffers() {
    return {&q, &k, &v, &o, &lse, &own_q, &own_k, &own_v, &own_o, &own_lse};
  }
};

// Bytes of device memory in a list of buffers.
template <size_t N>
int64_t total_bytes(const std::array<DeviceBuffer*, N>& buffers) {
  int64_t bytes = 0;
  for (const DeviceBuffer* b : buffers) bytes += static_cast<int64_t>(b->bytes);
  return bytes;
}

}  // namespace cad::cad_plugin
