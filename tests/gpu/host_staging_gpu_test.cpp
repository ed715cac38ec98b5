// host_staging_gpu_test.cpp -- kernels::HostStaging: a copy ordered on a stream that is held up returns at once
// (it does not wait for the stream), lands in order once the stream runs, and reuses its pinned buffers only
// after the copy that last read them has run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "gpu_harness.h"
#include "host_staging.h"

namespace cad::gpu_test {
namespace {

// A stream held up by a host function until the test lets it go (or 30 s pass: a copy that waited for the
// stream would otherwise hang the test instead of failing it).
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> timed_out{false};
  static void CUDART_CB hold(void* self) {
    auto* gate = static_cast<Gate*>(self);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!gate->open.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        gate->timed_out = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
};

std::vector<int64_t> iota_from(int64_t first, size_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(HostStaging, ACopyBehindAHeldStreamReturnsAtOnceAndLandsInOrder) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = 300000;  // 2.4 MB: far above what a driver copies inline from pageable memory
  DeviceBuffer first(n * sizeof(int64_t)), second(n * sizeof(int64_t));
  kernels::HostStaging staging;
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(stream, Gate::hold, &gate), cudaSuccess);
  {
    std::vector<int64_t> host = iota_from(7, n);
    ASSERT_EQ(staging.copy(first.get(), host.data(), n * sizeof(int64_t), stream), cudaSuccess);
  }  // the source is gone before the stream has run: the data was taken
  // The first buffer is still to be read by its transfer: the second copy takes a buffer of its own.
  const std::vector<int64_t> again = iota_from(1000, n);
  ASSERT_EQ(staging.copy(second.get(), again.data(), n * sizeof(int64_t), stream), cudaSuccess);
  EXPECT_FALSE(gate.timed_out.load()) << "copy() waited for the held stream";
  const size_t held = staging.pinned_bytes();
  EXPECT_GE(held, 2 * n * sizeof(int64_t));
  gate.open = true;
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<int64_t> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), first.get(), n * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, iota_from(7, n));
  ASSERT_EQ(cudaMemcpy(back.data(), second.get(), n * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, again);
  // Both transfers have run: a third copy reuses a buffer instead of pinning more memory.
  ASSERT_EQ(staging.copy(first.get(), again.data(), n * sizeof(int64_t), stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(staging.pinned_bytes(), held);
  ASSERT_EQ(cudaMemcpy(back.data(), first.get(), n * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, again);
  cudaStreamDestroy(stream);
}

// Teardown behind a stream that does not run (a peer gone in front of the copy) ends: after 10 s the destructor
// leaves its buffers allocated instead of waiting (cudaFreeHost would wait for the whole device). The transfer
// then still reads valid memory when the stream runs.
TEST(HostStaging, TeardownBehindAStuckStreamEndsAndLeavesTheBuffers) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const size_t n = 4096;
  DeviceBuffer dst(n * sizeof(int64_t));
  Gate gate;
  ASSERT_EQ(cudaLaunchHostFunc(stream, Gate::hold, &gate), cudaSuccess);
  const std::vector<int64_t> host = iota_from(3, n);
  {
    kernels::HostStaging staging;
    ASSERT_EQ(staging.copy(dst.get(), host.data(), n * sizeof(int64_t), stream), cudaSuccess);
  }  // the transfer has not run: the destructor gives up after 10 s
  EXPECT_FALSE(gate.timed_out.load()) << "the destructor waited for the held stream";
  gate.open = true;
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<int64_t> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), dst.get(), n * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace cad::gpu_test
