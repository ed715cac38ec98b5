// split_worker.cpp -- see split_worker.h.
#include "split_worker.h"

#include <utility>

namespace cad::split_comm {

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Worker::start(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    busy_ = true;
  }
  wake_.notify_all();
}

bool Worker::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return done_.wait_for(lock, timeout, [this] { return !busy_; });
}

void Worker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // A job handed over before a stop still runs: its caller may be waiting for it.
    wake_.wait(lock, [this] { return stop_ || busy_; });
    if (busy_) {
      std::function<void()> job = std::move(job_);
      lock.unlock();
      job();  // never throws: the jobs catch everything into their own result
      lock.lock();
      busy_ = false;
      done_.notify_all();
      continue;
    }
    if (stop_) return;
  }
}

}  // namespace cad::split_comm
