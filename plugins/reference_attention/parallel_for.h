// parallel_for.h -- the reference backend's only threading primitive: run independent work items on
// a few std::threads started for the call and joined before it returns (so no thread outlives a
// call, and destroying a context has nothing to join).
#pragma once

#include <cstdint>
#include <functional>

namespace cad::reference {

// Number of threads to use when the caller asks for `requested` (0 = the hardware's concurrency).
int resolve_num_threads(int requested);

// Runs body(item, worker) for every item in [0, num_items) on at most `num_threads` threads, the
// calling thread being one of them; `worker` is in [0, num_threads) and lets the body use
// per-thread scratch. Items are claimed dynamically, so a body must write outputs no other item
// writes: then results do not depend on the schedule or the thread count. If a body throws, the
// remaining items are skipped and the first exception is rethrown after every thread joined.
void parallel_for(int64_t num_items, int num_threads, const std::function<void(int64_t item, int worker)>& body);

}  // namespace cad::reference
