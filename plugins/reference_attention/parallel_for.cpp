// parallel_for.cpp -- see parallel_for.h.
#include "parallel_for.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace cad::reference {

int resolve_num_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : static_cast<int>(hardware);
}

void parallel_for(int64_t num_items, int num_threads, const std::function<void(int64_t, int)>& body) {
  if (num_items <= 0) return;
  const int workers = static_cast<int>(std::min<int64_t>(std::max(num_threads, 1), num_items));
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;

  const auto work = [&](int worker) {
    try {
      for (int64_t item = next++; item < num_items && !stop.load(); item = next++) body(item, worker);
    } catch (...) {
      stop = true;
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(workers - 1));
  for (int worker = 1; worker < workers; ++worker) {
    try {
      threads.emplace_back(work, worker);
    } catch (const std::system_error&) {
      break;  // the system refused another thread: the ones already running (and this one) do the rest
    }
  }
  work(0);
  for (auto& thread : threads) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace cad::reference
