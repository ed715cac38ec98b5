// split_worker.h -- one helper thread that runs the cross-node half of a split exchange while the calling
// thread runs the node-local half, so that both transfers are in flight at once on CPU communicators
// (whose calls block until the bytes have moved). The caller waits for it with a deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace cad::split_comm {

class Worker {
 public:
  Worker();
  ~Worker();  // joins the thread: waits for a job still running (bounded by the borrowed instance's own timeout)
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Hands `job` to the thread. Only while idle (the previous job finished): the caller never starts a job
  // after a wait that timed out (the instance is unusable then).
  void start(std::function<void()> job);
  // True once the job finished; false if it still runs after `timeout`.
  bool wait_for(std::chrono::milliseconds timeout);

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_;  // a job or stop for the thread
  std::condition_variable done_;  // the job finished, for the caller
  std::function<void()> job_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cad::split_comm
