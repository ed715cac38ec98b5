// host_staging.cpp -- see host_staging.h.
#include "host_staging.h"

#include <chrono>
#include <cstring>
#include <thread>

namespace cad::kernels {

namespace {

// Buffers come in powers of two from 64 KiB, so that plans of similar size reuse the same ones.
size_t buffer_size(size_t bytes) {
  size_t size = size_t{64} << 10;
  while (size < bytes) size <<= 1;
  return size;
}

}  // namespace

HostStaging::~HostStaging() {
  // A transfer may still read a buffer. Wait for them, but only so long: teardown after a failure can find a stream
  // that never runs again (a peer gone in front of the copy), and cudaFreeHost synchronises the whole device. Then
  // the buffers are left to the process's end rather than the teardown hanging.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (const Buffer& b : buffers_) {
    while (cudaEventQuery(b.done) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) {
        (void)cudaGetLastError();
        return;  // left allocated: freeing would wait for the stuck stream
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  (void)cudaGetLastError();
  for (const Buffer& b : buffers_) {
    cudaEventDestroy(b.done);
    cudaFreeHost(b.host);
  }
}

cudaError_t HostStaging::copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  Buffer* chosen = nullptr;
  for (Buffer& b : buffers_) {
    if (b.bytes < bytes || (chosen != nullptr && chosen->bytes <= b.bytes)) continue;
    const cudaError_t state = cudaEventQuery(b.done);
    if (state == cudaErrorNotReady) {
      (void)cudaGetLastError();  // still read by its transfer: not an error to keep
      continue;
    }
    if (state != cudaSuccess) return state;
    chosen = &b;  // the smallest free buffer that fits
  }
  if (chosen == nullptr) {
    Buffer b;
    b.bytes = buffer_size(bytes);
    cudaError_t err = cudaHostAlloc(&b.host, b.bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) return err;
    err = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
    if (err != cudaSuccess) {
      cudaFreeHost(b.host);
      return err;
    }
    buffers_.push_back(b);
    chosen = &buffers_.back();
  }
  std::memcpy(chosen->host, src, bytes);
  const cudaError_t err = cudaMemcpyAsync(dst, chosen->host, bytes, cudaMemcpyHostToDevice, stream);
  if (err != cudaSuccess) return err;
  return cudaEventRecord(chosen->done, stream);
}

size_t HostStaging::pinned_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const Buffer& b : buffers_) total += b.bytes;
  return total;
}

}  // namespace cad::kernels
