// host_staging.h -- copies from host memory to the GPU that never wait for the stream they are ordered on.
//
// A cudaMemcpyAsync from pageable host memory may synchronise with its stream before it stages the data
// (CUDA's "API synchronization behavior"): the calling thread then waits until the GPU has run everything
// queued on that stream before the copy. A plan made ahead on a planning thread, ordered on the training
// stream, waited that way for the training stream to drain (1.3-2.3 s per plan on 4 H200s at 128K-256K tokens
// per GPU), and it waited holding the CAD instance's lock, so the training thread's next CAD call waited too.
//
// HostStaging copies through pinned buffers of its own: copy() memcpy's the data into a free pinned buffer,
// enqueues the transfer and records an event after it, and returns; a buffer is free again once the transfer
// that last read it has run. Buffers are only freed with the object (cudaFreeHost synchronises the device), and
// not even then if a transfer has not run 10 s into the teardown (its stream stuck behind a failed peer).
// One object serves one device (its events are that device's). Thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <vector>

namespace cad::kernels {

class HostStaging {
 public:
  HostStaging() = default;
  ~HostStaging();  // waits (10 s at most) for the transfers still reading its buffers, then frees them
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Copies `bytes` from host memory `src` to device memory `dst`, in the order of `stream`, without waiting for
  // it; `src` may be reused as soon as this returns. The device current now must be the stream's.
  cudaError_t copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

  size_t pinned_bytes() const;  // pinned host memory held

 private:
  struct Buffer {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the last transfer that read this buffer
  };
  mutable std::mutex mutex_;
  std::vector<Buffer> buffers_;
};

}  // namespace cad::kernels
