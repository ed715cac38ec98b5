// split_stream.h -- on stream communicators (NCCL), the second stream that lets the two halves of a split
// exchange run at once on the device: fork() makes a side stream wait for the caller's stream and returns it,
// join() makes the caller's stream wait for the side stream. Built with CUDA (split_stream_cuda.cpp) or
// without (split_stream_none.cpp: fork returns the caller's stream and join does nothing, so the halves run in
// stream order one after the other).
#pragma once

namespace cad::split_comm {

class StreamFork {
 public:
  explicit StreamFork(int device);  // the side stream and its events live on this CUDA device
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;

  void* fork(void* stream);  // throws Failure(CAD_STATUS_DEVICE_ERROR) naming the CUDA call
  void join(void* stream);

 private:
  void* side_ = nullptr;
  void* forked_ = nullptr;  // event: the caller's stream reached the exchange
  void* joined_ = nullptr;  // event: the side stream finished its half
};

}  // namespace cad::split_comm
