// nccl_copy_engine.h -- all_to_all_v through the GPUs' copy engines (config "copy_engines"), for ranks on one host
// whose GPUs reach each other (NVLink or PCIe peer access).
//
// Why: NCCL's send/recv runs as kernels on SMs. Beside the project's persistent attention kernels (one block per
// SM until they end) those kernels wait for SMs, so an exchange meant to run under the attention runs after it
// (bench/comm/copy_engine_overlap.py on 2 H200s: 126 GB/s beside the kernel; the copy engines 373 GB/s, costing
// the kernel about 12% of the time they overlap it). A copy engine needs no SM.
//
// How (the rounds themselves: copy_engine_schedule.h): every rank owns, in its GPU memory, a flag area and a staging
// area shared with its peers through CUDA IPC at create (every rank on one host: create refuses others, naming the
// hosts). Flags: full[s] (the last round sender s finished into my slots) and consumed[p] (the last round of mine
// that receiver p copied out), one 64-bit word each. Staging: two slots of `slot_bytes` per sender. A message from
// s to p moves in rounds of at most slot_bytes through p's slots for s, alternating: the sender waits (on the GPU)
// until p consumed round k - 2, copies round k into p's slot (cudaMemcpyAsync across devices: a copy engine) and
// writes full[s] = k into p's flags; the receiver waits for full[s] >= k, copies the slot into its recv buffer and
// writes consumed[p] = k into s's flags. Waits and writes are stream memory operations (cuStreamWaitValue64 /
// cuStreamWriteValue64, no SM either). Every peer has a send and a receive stream of its own, forked from and
// joined back to the caller's stream (the fork comes before the message to self, which copies meanwhile): a pair's
// rounds never wait for another pair's (with one stream per direction for all peers, a cycle of ranks each waiting
// for the next could deadlock). Round numbers count up over the instance's life on both sides of a pair alike: the
// calls are collective and a pair's counts agree. Under CUDA-graph capture the calls go through NCCL instead.
//
// Failures: each exchange is watched like an NCCL operation (GuardedComm::watch_enqueued). When one times out,
// release() sets every flag word of this rank to the largest value, so that this GPU's waits return (the received
// bytes are garbage by then) and the communicator reports the timeout from then on.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "plugin_support.h"

namespace cad::nccl_comm {

class NcclContext;

class CopyEngineExchange {
 public:
  // Collective over the context's ranks (all_gathers the IPC handles through NCCL). Throws where a peer's memory
  // cannot be mapped (another host, no peer access) or the driver lacks stream memory operations.
  CopyEngineExchange(NcclContext& ctx, uint64_t slot_bytes);
  ~CopyEngineExchange();
  CopyEngineExchange(const CopyEngineExchange&) = delete;
  CopyEngineExchange& operator=(const CopyEngineExchange&) = delete;

  // all_to_all_v's contract (counts checked by the caller), enqueued on `stream`.
  void all_to_all_v(const void* send, const uint64_t* send_counts, const uint64_t* send_displs, void* recv,
                    const uint64_t* recv_counts, const uint64_t* recv_displs, cudaStream_t stream);
  // Makes every wait of this rank's streams return (the watchdog's timeout). Thread-safe; no throw.
  void release() noexcept;

 public:
  using StreamValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

 private:
  void free_resources() noexcept;  // the destructor's work, also for a create that failed half way
  void wait_at_least(cudaStream_t stream, const uint64_t* word, uint64_t value);
  void write(cudaStream_t stream, uint64_t* word, uint64_t value);
  uint64_t* flags_of(int rank) const { return static_cast<uint64_t*>(base_of_[static_cast<size_t>(rank)]); }
  char* slot(int owner, int sender, uint64_t round) const;

  int device_, rank_, world_;
  uint64_t slot_bytes_;
  size_t flag_bytes_ = 0;  // 2 * world words, rounded up to 256 bytes (the staging area's alignment)
  void* area_ = nullptr;   // this rank's flags, then its staging
  std::vector<void*> base_of_;  // every rank's area as this process sees it (its own, or mapped by IPC)
  std::vector<cudaStream_t> send_streams_, recv_streams_;  // per peer
  std::vector<cudaEvent_t> send_done_, recv_done_;         // per peer: joined by the caller's stream
  cudaEvent_t fork_ = nullptr;
  cudaStream_t release_stream_ = nullptr;
  std::vector<uint64_t> sent_rounds_, received_rounds_;  // per peer, over the instance's life
  StreamValue64 wait_value_ = nullptr, write_value_ = nullptr;
};

}  // namespace cad::nccl_comm
