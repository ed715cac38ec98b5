// comm.h -- the communicator instance CAD borrows from the host, as a small C++ wrapper whose calls
// throw plugin::Failure (naming the instance and the operation) instead of returning a status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cad_communicator_v1.h"
#include "exchange.h"

namespace cad::cad_plugin {

// Host memory through a communicator whose buffers live on a GPU (get_device: CUDA, e.g. NCCL): a device
// buffer and a private stream on that GPU (host_gather.cpp; host_gather_none.cpp refuses it).
struct HostGatherStaging;
struct HostGatherStagingDeleter {
  void operator()(HostGatherStaging* staging) const;
};

class Comm {
 public:
  Comm(const cad_communicator_v1_t* table, void* instance, std::string name);

  int32_t rank() const { return rank_; }
  int32_t world() const { return world_; }
  const std::string& name() const { return name_; }
  cad_device_v1_t device() const { return device_; }  // where its buffers live (asked once, at construction)

  // Every rank contributes `bytes` bytes of HOST memory; recv (host) gets world * bytes, by rank; returns
  // when recv is filled. A communicator on device memory (NCCL) reads and writes only its device's memory,
  // so there the bytes go through a device buffer (staged_all_gather); on a CPU communicator directly.
  void all_gather(const void* send, uint64_t bytes, void* recv);
  // The communicator's own all_gather: buffers where get_device says, enqueued on `stream`.
  void raw_all_gather(const void* send, uint64_t bytes, void* recv, void* stream);
  // `stream`: NULL for a CPU communicator; the stream to enqueue on for a device one.
  void all_to_all_v(const std::byte* send, const Transfer& transfer, std::byte* recv, void* stream = nullptr);

  // All ranks' copies of a trivially copyable value, by rank.
  template <class T>
  std::vector<T> all_gather_value(const T& value) {
    std::vector<T> all(static_cast<size_t>(world_));
    all_gather(&value, sizeof(T), all.data());
    return all;
  }

 private:
  [[noreturn]] void failed(const char* operation, cad_status_t status) const;

  const cad_communicator_v1_t* table_;
  void* instance_;
  std::string name_;
  int32_t rank_ = 0;
  int32_t world_ = 1;
  bool identified_ = false;  // rank_ and world_ are the communicator's: failures name them from then on
  cad_device_v1_t device_{CAD_DEVICE_CPU, 0};
  std::unique_ptr<HostGatherStaging, HostGatherStagingDeleter> staging_;  // made at the first staged gather
};

// all_gather of host bytes through `staging`'s device buffer: copy in, comm.raw_all_gather on the private
// stream, copy out, wait. The wait is bounded by the communicator's own timeout (its watchdog aborts a
// collective a peer never joins); a zero-byte call afterwards lets the communicator report that abort, so
// that no rank reads a buffer an aborted collective left half written.
HostGatherStaging* make_host_gather_staging(int device);
void staged_all_gather(HostGatherStaging& staging, Comm& comm, const void* send, uint64_t bytes, void* recv);

// Collective agreement on an outcome. Every rank passes its own status and message; if any rank
// failed, EVERY rank throws the failure of the lowest failing rank, with the same status and the
// message "<what> on rank R: <its message>". Costs one small all_gather.
void agree(Comm& comm, cad_status_t status, const std::string& message, const char* what);

}  // namespace cad::cad_plugin
