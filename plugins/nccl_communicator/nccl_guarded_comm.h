// nccl_guarded_comm.h -- an NCCL communicator that cannot hang its host.
//
// The communicator is non-blocking (ncclConfig_t.blocking = 0) unless asked otherwise, so every NCCL call returns at once
// and ncclCommAbort can never deadlock against a call in progress. A caller's enqueue is polled to
// host-side completion against the deadline; then an event recorded after it on the caller's stream
// is handed to a watchdog thread owned by this object (joined in the destructor). The watchdog
// polls the events of enqueued operations and ncclCommGetAsyncError; when an operation is still not
// complete `timeout_ms` after it was enqueued, or NCCL reports an asynchronous error, it aborts the
// communicator (ncclCommAbort makes NCCL's kernels return, so the caller's stream drains) and records
// the failure, which every later call reports (CAD_STATUS_TIMEOUT naming the operation, or
// CAD_STATUS_COMMUNICATION with NCCL's text).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "plugin_support.h"

namespace cad::nccl_comm {

class GuardedComm {
 public:
  using Clock = std::chrono::steady_clock;

  // Creates the communicator (collective over the `world_size` ranks sharing `id`) on `device`.
  // `blocking` makes it a blocking NCCL communicator (see NcclConfig::blocking_comm); `max_ctas` > 0 bounds its
  // operations' CTAs (NcclConfig::max_ctas).
  GuardedComm(int device, int rank, int world_size, const ncclUniqueId& id, int64_t timeout_ms, bool blocking,
              int max_ctas, const plugin::Logger& logger);
  ~GuardedComm();
  GuardedComm(const GuardedComm&) = delete;
  GuardedComm& operator=(const GuardedComm&) = delete;

  // Runs `enqueue` (the NCCL calls of one operation, inside ncclGroupStart/End) on the live
  // communicator and hands the operation to the watchdog. Throws the recorded failure if the
  // communicator was aborted, or a new one if the enqueue fails or outlives the deadline.
  void launch(const char* operation, cudaStream_t stream, const std::function<ncclResult_t(ncclComm_t)>& enqueue);

  // Hands work already enqueued on `stream` (an operation that is not NCCL's: the copy-engine exchange) to the
  // watchdog under the same deadline. Throws the recorded failure if the communicator was aborted.
  void watch_enqueued(const char* operation, cudaStream_t stream);

  // Called (with the watchdog's lock held, once) when the communicator is aborted: lets work outside NCCL that
  // waits for peers return (CopyEngineExchange::release). An empty function clears it (before what it calls goes).
  void set_on_abort(std::function<void()> on_abort) {
    std::lock_guard<std::mutex> lock(mutex_);
    on_abort_ = std::move(on_abort);
  }

  // Throws the recorded failure, if any.
  void check_usable();

 private:
  void wait_host_side(const char* operation, Clock::time_point deadline);  // with mutex_ held
  void abort_locked(cad_status_t status, const std::string& reason);
  void watch_locked(const char* operation, cudaStream_t stream, Clock::time_point deadline);
  void watch();

  int device_;
  int64_t timeout_ms_;
  const plugin::Logger& logger_;
  std::mutex mutex_;
  std::condition_variable wake_;
  ncclComm_t comm_ = nullptr;  // null once aborted or destroyed
  cad_status_t failure_status_ = CAD_STATUS_OK;
  std::string failure_;
  struct Pending {
    cudaEvent_t event;
    std::string operation;
    Clock::time_point deadline;
  };
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_events_;
  bool stop_ = false;
  std::function<void()> on_abort_;
  std::thread watchdog_;
};

}  // namespace cad::nccl_comm
