// nccl_guarded_comm.cpp -- see nccl_guarded_comm.h.
#include "nccl_guarded_comm.h"

#include "nccl_errors.h"

namespace cad::nccl_comm {

using plugin::fail;
using plugin::format;

GuardedComm::GuardedComm(int device, int rank, int world_size, const ncclUniqueId& id, int64_t timeout_ms,
                         bool blocking, int max_ctas, const plugin::Logger& logger)
    : device_(device), timeout_ms_(timeout_ms), logger_(logger) {
  DeviceScope scope(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;  // 0: a stuck peer can never block a call, and abort cannot deadlock
  if (max_ctas > 0) {
    config.maxCTAs = max_ctas;
    config.minCTAs = 1;  // NCCL refuses minCTAs above maxCTAs; its default minimum can exceed a small maximum
  }
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    fail(CAD_STATUS_COMMUNICATION, "create: ncclCommInitRankConfig failed: " + nccl_text(result, comm));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  comm_ = comm;
  try {
    wait_host_side("create (ncclCommInitRankConfig)", Clock::now() + std::chrono::milliseconds(timeout_ms_));
  } catch (...) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    throw;
  }
  watchdog_ = std::thread([this] { watch(); });
}

GuardedComm::~GuardedComm() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  watchdog_.join();
  cudaSetDevice(device_);  // destroy may run on any thread; its device is not restored: we are going away
  for (const Pending& p : pending_) cudaEventDestroy(p.event);
  for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  if (comm_ == nullptr) return;
  // A live communicator: finalise (flushes outstanding work) within the deadline, else abort.
  ncclResult_t result = ncclCommFinalize(comm_);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  ncclResult_t state = result;
  while (result == ncclSuccess || result == ncclInProgress) {
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (result != ncclSuccess && result != ncclInProgress) state = result;
  if (state == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
  comm_ = nullptr;
}

void GuardedComm::check_usable() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_status_ != CAD_STATUS_OK) fail(failure_status_, failure_ + "; the communicator was aborted");
}

void GuardedComm::abort_locked(cad_status_t status, const std::string& reason) {
  if (failure_status_ == CAD_STATUS_OK) {
    failure_status_ = status;
    failure_ = reason;
  }
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
    if (on_abort_) on_abort_();
  }
  logger_.log(CAD_LOG_ERROR, reason + "; communicator aborted");
}

void GuardedComm::wait_host_side(const char* operation, Clock::time_point deadline) {
  // Enqueueing normally finishes within microseconds: spin (yielding) for the first millisecond so
  // that back-to-back calls keep the GPU busy, then poll gently.
  const auto spin_until = Clock::now() + std::chrono::milliseconds(1);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) state = result;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string reason = format("%s: NCCL reported %s", operation, nccl_text(state, comm_).c_str());
      abort_locked(CAD_STATUS_COMMUNICATION, reason);
      fail(CAD_STATUS_COMMUNICATION, reason);
    }
    if (Clock::now() >= deadline) {
      const std::string reason = format("%s: timed out after %lld ms (NCCL still setting up; is every rank taking "
                                        "part?)", operation, static_cast<long long>(timeout_ms_));
      abort_locked(CAD_STATUS_TIMEOUT, reason);
      fail(CAD_STATUS_TIMEOUT, reason);
    }
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void GuardedComm::launch(const char* operation, cudaStream_t stream,
                         const std::function<ncclResult_t(ncclComm_t)>& enqueue) {
  DeviceScope scope(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_status_ != CAD_STATUS_OK) fail(failure_status_, failure_ + "; the communicator was aborted");
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  ncclResult_t result = ncclGroupStart();
  if (result == ncclSuccess) {
    result = enqueue(comm_);
    const ncclResult_t end = ncclGroupEnd();  // always close the group, even after a failed call inside
    if (result == ncclSuccess) result = end;
  }
  if (result != ncclSuccess && result != ncclInProgress) {
    fail(CAD_STATUS_COMMUNICATION, format("%s: enqueue failed: %s", operation, nccl_text(result, comm_).c_str()));
  }
  wait_host_side(operation, deadline);
  watch_locked(operation, stream, deadline);
  lock.unlock();
  wake_.notify_all();
}

void GuardedComm::watch_enqueued(const char* operation, cudaStream_t stream) {
  DeviceScope scope(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  if (failure_status_ != CAD_STATUS_OK) fail(failure_status_, failure_ + "; the communicator was aborted");
  watch_locked(operation, stream, Clock::now() + std::chrono::milliseconds(timeout_ms_));
  lock.unlock();
  wake_.notify_all();
}

void GuardedComm::watch_locked(const char* operation, cudaStream_t stream, Clock::time_point deadline) {
  // Under CUDA-graph capture the operation only becomes a graph node: nothing runs now, and an event
  // recorded into the capture cannot be polled. The watchdog guards the eager calls; a replayed graph's
  // collectives are the graph owner's to wait for.
  if (stream_capturing(stream, /*if_unknown=*/false)) return;

  cudaEvent_t event = nullptr;
  if (!spare_events_.empty()) {
    event = spare_events_.back();
    spare_events_.pop_back();
  } else {
    check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), std::string(operation) + ": cudaEventCreate");
  }
  const cudaError_t recorded = cudaEventRecord(event, stream);
  if (recorded != cudaSuccess) {
    spare_events_.push_back(event);
    check_cuda(recorded, std::string(operation) + ": cudaEventRecord on the caller's stream");
  }
  pending_.push_back(Pending{event, operation, deadline});
}

void GuardedComm::watch() {
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (pending_.empty() || comm_ == nullptr) {
      wake_.wait(lock, [this] { return stop_ || (!pending_.empty() && comm_ != nullptr); });
      continue;
    }
    Pending& oldest = pending_.front();
    const cudaError_t state = cudaEventQuery(oldest.event);
    if (state == cudaSuccess) {
      spare_events_.push_back(oldest.event);
      pending_.pop_front();
      continue;
    }
    if (state != cudaErrorNotReady) {
      abort_locked(CAD_STATUS_DEVICE_ERROR, oldest.operation + ": the CUDA stream failed: " + cudaGetErrorString(state));
      continue;
    }
    ncclResult_t async_state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async_state);
    if (async_state != ncclSuccess && async_state != ncclInProgress) {
      abort_locked(CAD_STATUS_COMMUNICATION, oldest.operation + ": NCCL reported " + nccl_text(async_state, comm_));
      continue;
    }
    if (Clock::now() >= oldest.deadline) {
      abort_locked(CAD_STATUS_TIMEOUT,
                   format("%s: not complete %lld ms after it was enqueued (timeout_ms); a peer rank did not take "
                          "part, or the stream was blocked before it",
                          oldest.operation.c_str(), static_cast<long long>(timeout_ms_)));
      continue;
    }
    wake_.wait_for(lock, std::chrono::milliseconds(1));
  }
}

}  // namespace cad::nccl_comm
