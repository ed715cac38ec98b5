// host_gather.cpp -- Comm::all_gather of host bytes over a communicator that moves device memory (comm.h).
// NCCL reads and writes only GPU memory: handed the host vectors of a plan's piece tables it faulted with an
// illegal memory access on every rank as soon as the world had two GPUs (one rank's all_gather is a plain
// copy, which had hidden it). Built with CUDA; host_gather_none.cpp stands in otherwise.
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "comm.h"
#include "cuda_check.h"

namespace cad::cad_plugin {

struct HostGatherStaging {
  int device = 0;
  cudaStream_t stream = nullptr;  // private: the bytes depend on no work of the caller's streams
  void* buffer = nullptr;         // cudaMalloc'd directly: a few KiB, kept for the instance's life
  size_t capacity = 0;
  ~HostGatherStaging() {
    cad::kernels::DeviceScope scope(device);
    if (buffer != nullptr) cudaFree(buffer);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

void HostGatherStagingDeleter::operator()(HostGatherStaging* staging) const { delete staging; }

HostGatherStaging* make_host_gather_staging(int device) {
  DeviceScope scope(device);
  auto staging = std::make_unique<HostGatherStaging>();
  staging->device = device;
  check_cuda(cudaStreamCreateWithFlags(&staging->stream, cudaStreamNonBlocking), "creating the all_gather stream");
  return staging.release();
}

void staged_all_gather(HostGatherStaging& staging, Comm& comm, const void* send, uint64_t bytes, void* recv) {
  if (bytes == 0) {
    comm.raw_all_gather(nullptr, 0, nullptr, staging.stream);
    return;
  }
  DeviceScope scope(staging.device);
  const size_t world = static_cast<size_t>(comm.world());
  const size_t needed = bytes * (world + 1);  // world blocks received, then this rank's block to send
  if (needed > staging.capacity) {
    if (staging.buffer != nullptr) check_cuda(cudaFree(staging.buffer), "cudaFree (all_gather staging)");
    staging.buffer = nullptr;
    staging.capacity = 0;
    check_cuda(cudaMalloc(&staging.buffer, needed), "cudaMalloc (all_gather staging)");
    staging.capacity = needed;
  }
  std::byte* received = static_cast<std::byte*>(staging.buffer);
  std::byte* mine = received + bytes * world;
  check_cuda(cudaMemcpyAsync(mine, send, bytes, cudaMemcpyHostToDevice, staging.stream), "all_gather: copy to the GPU");
  comm.raw_all_gather(mine, bytes, received, staging.stream);
  check_cuda(cudaMemcpyAsync(recv, received, bytes * world, cudaMemcpyDeviceToHost, staging.stream),
             "all_gather: copy from the GPU");
  const cudaError_t waited = cudaStreamSynchronize(staging.stream);
  comm.raw_all_gather(nullptr, 0, nullptr, staging.stream);  // reports a collective the communicator aborted
  check_cuda(waited, "all_gather: waiting for the collective");
}

}  // namespace cad::cad_plugin
