// split_stream_none.cpp -- StreamFork without CUDA: no side stream (side_ stays NULL), so the halves go onto
// the caller's stream in order.
#include "split_stream.h"

namespace cad::split_comm {

StreamFork::StreamFork(int) {}
StreamFork::~StreamFork() = default;
void* StreamFork::fork(void* stream) { return side_ != nullptr ? side_ : stream; }
void StreamFork::join(void*) {
  (void)forked_;  // the events exist only with CUDA
  (void)joined_;
}

}  // namespace cad::split_comm
