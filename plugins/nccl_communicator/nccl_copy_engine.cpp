// nccl_copy_engine.cpp -- see nccl_copy_engine.h.
#include "nccl_copy_engine.h"

#include <unistd.h>

#include <cstring>

#include "copy_engine_schedule.h"
#include "nccl_context.h"
#include "nccl_errors.h"

namespace cad::nccl_comm {

using plugin::fail;
using plugin::format;

namespace {

CopyEngineExchange::StreamValue64 driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    fail(CAD_STATUS_UNSUPPORTED, format("plugin 'nccl' config: key 'copy_engines' needs the driver's %s (stream memory "
                                        "operations), which this driver does not offer", name));
  }
  return reinterpret_cast<CopyEngineExchange::StreamValue64>(fn);
}

// What a rank tells the others at create: the IPC handle of its area and where it runs.
struct Peer {
  cudaIpcMemHandle_t handle;
  char host[64];
  int32_t device;
};

Peer this_peer(const cudaIpcMemHandle_t& handle, int device) {
  Peer me{};
  me.handle = handle;
  if (gethostname(me.host, sizeof(me.host) - 1) != 0) std::strcpy(me.host, "?");
  me.device = device;
  return me;
}

// Every rank's Peer, all-gathered through the NCCL communicator (collective; waits).
std::vector<Peer> all_gather_peers(NcclContext& ctx, const Peer& mine) {
  const size_t w = static_cast<size_t>(ctx.world_size());
  struct Resources {
    cudaStream_t stream = nullptr;
    char* bytes = nullptr;  // mine, then every rank's
    ~Resources() {
      if (bytes != nullptr) cudaFree(bytes);
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  } r;
  const size_t h = sizeof(Peer);
  check_cuda(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking), "copy_engines: cudaStreamCreate");
  check_cuda(cudaMalloc(&r.bytes, h * (w + 1)), "copy_engines: cudaMalloc of the handle exchange");
  check_cuda(cudaMemcpyAsync(r.bytes, &mine, h, cudaMemcpyHostToDevice, r.stream), "copy_engines: handle upload");
  ctx.comm().launch("create (copy_engines: IPC handles)", r.stream, [&](ncclComm_t comm) {
    return ncclAllGather(r.bytes, r.bytes + h, h, ncclUint8, comm, r.stream);
  });
  std::vector<Peer> all(w);
  const cudaError_t copied = cudaMemcpyAsync(all.data(), r.bytes + h, h * w, cudaMemcpyDeviceToHost, r.stream);
  const cudaError_t synced = copied == cudaSuccess ? cudaStreamSynchronize(r.stream) : copied;
  ctx.comm().check_usable();
  check_cuda(synced, "copy_engines: waiting for the handle exchange");
  for (Peer& p : all) p.host[sizeof(p.host) - 1] = '\0';
  return all;
}

}  // namespace

CopyEngineExchange::CopyEngineExchange(NcclContext& ctx, uint64_t slot_bytes)
    : device_(ctx.device()), rank_(ctx.rank()), world_(ctx.world_size()), slot_bytes_(slot_bytes) {
  DeviceScope scope(device_);
  wait_value_ = driver_entry("cuStreamWaitValue64");
  write_value_ = driver_entry("cuStreamWriteValue64");
  const size_t w = static_cast<size_t>(world_);
  flag_bytes_ = (2 * w * sizeof(uint64_t) + 255) / 256 * 256;
  const size_t area_bytes = flag_bytes_ + 2 * w * static_cast<size_t>(slot_bytes_);
  base_of_.assign(w, nullptr);
  sent_rounds_.assign(w, 0);
  received_rounds_.assign(w, 0);
  try {
    check_cuda(cudaMalloc(&area_, area_bytes),
               format("copy_engines: cudaMalloc of %zu bytes (flags and 2 slots of %llu bytes per rank; key "
                      "'copy_engine_slot_mib')", area_bytes, static_cast<unsigned long long>(slot_bytes_)));
    check_cuda(cudaMemset(area_, 0, flag_bytes_), "copy_engines: zeroing the flags");
    cudaIpcMemHandle_t handle{};
    check_cuda(cudaIpcGetMemHandle(&handle, area_), "copy_engines: cudaIpcGetMemHandle");
    const std::vector<Peer> peers = all_gather_peers(ctx, this_peer(handle, device_));
    const Peer& mine = peers[static_cast<size_t>(rank_)];
    for (int r = 0; r < world_; ++r) {  // every rank sees the same table: all refuse alike
      const Peer& other = peers[static_cast<size_t>(r)];
      if (std::strcmp(other.host, peers[0].host) != 0) {
        fail(CAD_STATUS_UNSUPPORTED,
             format("plugin 'nccl' config: key 'copy_engines' needs every rank on one host, but rank 0 runs on '%s' "
                    "and rank %d on '%s' (leave copy_engines off across hosts)", peers[0].host, r, other.host));
      }
    }
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) {
        base_of_[static_cast<size_t>(r)] = area_;
        continue;
      }
      void* mapped = nullptr;
      const Peer& other = peers[static_cast<size_t>(r)];
      const cudaError_t opened = cudaIpcOpenMemHandle(&mapped, other.handle, cudaIpcMemLazyEnablePeerAccess);
      if (opened != cudaSuccess) {
        cudaGetLastError();
        fail(CAD_STATUS_UNSUPPORTED,
             format("plugin 'nccl' config: key 'copy_engines' needs every rank's GPU memory mapped into the others "
                    "(peer access between the GPUs): rank %d (CUDA device %d on '%s') could not map rank %d's "
                    "(device %d): %s", rank_, mine.device, mine.host, r, other.device, cudaGetErrorString(opened)));
      }
      base_of_[static_cast<size_t>(r)] = mapped;
    }
    send_streams_.assign(w, nullptr);
    recv_streams_.assign(w, nullptr);
    send_done_.assign(w, nullptr);
    recv_done_.assign(w, nullptr);
    int least = 0, greatest = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "copy_engines: stream priorities");
    for (size_t p = 0; p < w; ++p) {
      if (static_cast<int>(p) == rank_) continue;
      for (cudaStream_t* s : {&send_streams_[p], &recv_streams_[p]}) {
        check_cuda(cudaStreamCreateWithPriority(s, cudaStreamNonBlocking, greatest), "copy_engines: cudaStreamCreate");
      }
      for (cudaEvent_t* e : {&send_done_[p], &recv_done_[p]}) {
        check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "copy_engines: cudaEventCreate");
      }
    }
    check_cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "copy_engines: cudaEventCreate");
    check_cuda(cudaStreamCreateWithFlags(&release_stream_, cudaStreamNonBlocking), "copy_engines: cudaStreamCreate");
  } catch (...) {
    free_resources();
    throw;
  }
}

CopyEngineExchange::~CopyEngineExchange() { free_resources(); }

void CopyEngineExchange::free_resources() noexcept {
  cudaSetDevice(device_);
  release();  // nothing may still wait: a peer that is gone would hang the synchronisations below
  if (release_stream_ != nullptr) cudaStreamSynchronize(release_stream_);
  for (cudaStream_t s : send_streams_) if (s != nullptr) cudaStreamSynchronize(s);
  for (cudaStream_t s : recv_streams_) if (s != nullptr) cudaStreamSynchronize(s);
  for (auto* streams : {&send_streams_, &recv_streams_}) {
    for (cudaStream_t& s : *streams) {
      if (s != nullptr) cudaStreamDestroy(s);
      s = nullptr;
    }
  }
  for (auto* events : {&send_done_, &recv_done_}) {
    for (cudaEvent_t& e : *events) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  fork_ = nullptr;
  if (release_stream_ != nullptr) cudaStreamDestroy(release_stream_);
  release_stream_ = nullptr;
  for (size_t r = 0; r < base_of_.size(); ++r) {
    if (static_cast<int>(r) != rank_ && base_of_[r] != nullptr) cudaIpcCloseMemHandle(base_of_[r]);
    base_of_[r] = nullptr;
  }
  if (area_ != nullptr) cudaFree(area_);
  area_ = nullptr;
  cudaGetLastError();
}

char* CopyEngineExchange::slot(int owner, int sender, uint64_t round) const {
  return static_cast<char*>(base_of_[static_cast<size_t>(owner)]) + flag_bytes_ +
         copy_engine::slot_index(sender, round) * slot_bytes_;
}

void CopyEngineExchange::wait_at_least(cudaStream_t stream, const uint64_t* word, uint64_t value) {
  const CUresult r = wait_value_(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), value,
                                 CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) fail(CAD_STATUS_DEVICE_ERROR, format("copy_engines: cuStreamWaitValue64 failed (%d)", r));
}

void CopyEngineExchange::write(cudaStream_t stream, uint64_t* word, uint64_t value) {
  const CUresult r = write_value_(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(word), value,
                                  CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) fail(CAD_STATUS_DEVICE_ERROR, format("copy_engines: cuStreamWriteValue64 failed (%d)", r));
}

void CopyEngineExchange::all_to_all_v(const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                                      void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs,
                                      cudaStream_t stream) {
  DeviceScope scope(device_);
  const char* from = static_cast<const char*>(send);
  char* to = static_cast<char*>(recv);
  const size_t w = static_cast<size_t>(world_);
  // The peers' streams start before the message to self, so that it copies while they move (a rank's message to
  // itself, the tasks it serves on its own rows, is often the largest).
  check_cuda(cudaEventRecord(fork_, stream), "all_to_all_v (copy_engines): cudaEventRecord");
  if (send_counts[rank_] > 0) {
    check_cuda(cudaMemcpyAsync(to + recv_displs[rank_], from + send_displs[rank_], send_counts[rank_],
                               cudaMemcpyDeviceToDevice, stream),
               "all_to_all_v (copy_engines): the message to self");
  }
  using copy_engine::Op;
  const std::vector<copy_engine::PeerOps> ops = copy_engine::schedule(rank_, world_, send_counts, recv_counts,
                                                                      slot_bytes_, sent_rounds_, received_rounds_);
  uint64_t* my_flags = flags_of(rank_);
  // Peers in the order rank + 1, rank + 2, ...: every rank starts with a different partner.
  for (size_t step = 1; step < w; ++step) {
    const int p = static_cast<int>((static_cast<size_t>(rank_) + step) % w);
    const size_t pi = static_cast<size_t>(p);
    for (const bool sending : {true, false}) {
      const std::vector<Op>& list = sending ? ops[pi].send : ops[pi].receive;
      if (list.empty()) continue;
      cudaStream_t s = sending ? send_streams_[pi] : recv_streams_[pi];
      check_cuda(cudaStreamWaitEvent(s, fork_, 0), "all_to_all_v (copy_engines): cudaStreamWaitEvent");
      for (const Op& op : list) {
        switch (op.kind) {
          case Op::WaitConsumed: wait_at_least(s, my_flags + w + pi, op.round); break;
          case Op::CopyToSlot:
            check_cuda(cudaMemcpyAsync(slot(p, rank_, op.round), from + send_displs[pi] + op.offset, op.bytes,
                                       cudaMemcpyDeviceToDevice, s),
                       format("all_to_all_v (copy_engines): the copy to rank %d", p));
            break;
          case Op::SignalFull: write(s, flags_of(p) + rank_, op.round); break;
          case Op::WaitFull: wait_at_least(s, my_flags + pi, op.round); break;
          case Op::CopyFromSlot:
            check_cuda(cudaMemcpyAsync(to + recv_displs[pi] + op.offset, slot(rank_, p, op.round), op.bytes,
                                       cudaMemcpyDeviceToDevice, s),
                       format("all_to_all_v (copy_engines): the copy out of rank %d's slot", p));
            break;
          case Op::SignalConsumed: write(s, flags_of(p) + w + static_cast<size_t>(rank_), op.round); break;
        }
      }
      cudaEvent_t done = sending ? send_done_[pi] : recv_done_[pi];
      check_cuda(cudaEventRecord(done, s), "all_to_all_v (copy_engines): cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(stream, done, 0), "all_to_all_v (copy_engines): joining a peer's stream");
    }
  }
}

void CopyEngineExchange::release() noexcept {
  if (area_ == nullptr) return;
  cudaSetDevice(device_);
  cudaMemsetAsync(area_, 0xff, flag_bytes_, release_stream_);  // every word the largest value: every wait returns
  cudaGetLastError();
}

}  // namespace cad::nccl_comm
