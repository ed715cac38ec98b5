// comm_test.cpp -- CAD's borrowed communicator (plugins/cad/comm.h) with a fake communicator table: the host
// all_gathers that planning and agreement use must reach a communicator on device memory (NCCL) as device
// buffers, never as the caller's host vectors. Handed host vectors, NCCL faulted with an illegal memory access
// on every rank of a 4-GPU job; one rank's gather is a plain copy, which had hidden it on one GPU.
// Without a GPU (CI) the device case must be refused with a message, the communicator never called.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "comm.h"
#include "plugin_support.h"

#ifdef CAD_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace {

using cad::cad_plugin::Comm;
using cad::plugin::Failure;

// One fake instance: world 2, this process rank 0. Its all_gather writes this rank's block, and fills the
// peer's block with kPeerByte, the way a transport would.
constexpr unsigned char kPeerByte = 0x5a;

struct Fake {
  cad_device_type_t device_type = CAD_DEVICE_CPU;
  int calls = 0;
  int zero_byte_calls = 0;
  bool saw_device_pointers = true;  // every non-empty call's buffers were device memory (CUDA fake)
  bool saw_stream = true;           // every call on the CUDA fake came with a stream
  cad_status_t fail_gather = CAD_STATUS_OK;     // what a call that moves bytes returns (a broken transport)
  const void* last_send = nullptr;  // of the last call that moved bytes
  cad_status_t fail_zero_byte = CAD_STATUS_OK;  // what the zero-byte check returns (an aborted communicator)
  std::string error;
};

cad_status_t get_rank(void*, int32_t* rank) { *rank = 0; return CAD_STATUS_OK; }
cad_status_t get_world_size(void*, int32_t* world) { *world = 2; return CAD_STATUS_OK; }
cad_status_t get_device(void* ctx, cad_device_v1_t* device) {
  *device = {static_cast<Fake*>(ctx)->device_type, 0};
  return CAD_STATUS_OK;
}
const char* last_error(void* ctx) { return static_cast<Fake*>(ctx)->error.c_str(); }
cad_status_t all_to_all_v(void*, const void*, const uint64_t*, const uint64_t*, void*, const uint64_t*,
                          const uint64_t*, void*) {
  return CAD_STATUS_INTERNAL;
}
cad_status_t barrier(void*, void*) { return CAD_STATUS_OK; }

#ifdef CAD_TEST_CUDA
bool is_device_memory(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice;
}
#endif

cad_status_t all_gather(void* ctx, const void* send, uint64_t bytes, void* recv, void* stream) {
  Fake& f = *static_cast<Fake*>(ctx);
  ++f.calls;
  if (bytes == 0) {
    ++f.zero_byte_calls;
    if (f.fail_zero_byte != CAD_STATUS_OK) f.error = "the collective was aborted after its timeout";
    return f.fail_zero_byte;
  }
  f.last_send = send;
  if (f.fail_gather != CAD_STATUS_OK) {
    f.error = "peer 1 did not answer";
    return f.fail_gather;
  }
  if (f.device_type == CAD_DEVICE_CPU) {
    std::memcpy(recv, send, bytes);
    std::memset(static_cast<unsigned char*>(recv) + bytes, kPeerByte, bytes);
    return CAD_STATUS_OK;
  }
#ifdef CAD_TEST_CUDA
  f.saw_device_pointers = f.saw_device_pointers && is_device_memory(send) && is_device_memory(recv);
  f.saw_stream = f.saw_stream && stream != nullptr;
  if (!f.saw_device_pointers) {
    f.error = "handed host memory";
    return CAD_STATUS_INVALID_ARGUMENT;  // touching it would be the illegal access NCCL made
  }
  auto s = static_cast<cudaStream_t>(stream);
  if (cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, s) != cudaSuccess ||
      cudaMemsetAsync(static_cast<unsigned char*>(recv) + bytes, kPeerByte, bytes, s) != cudaSuccess) {
    return CAD_STATUS_DEVICE_ERROR;
  }
  return CAD_STATUS_OK;
#else
  (void)stream;
  f.saw_device_pointers = false;
  return CAD_STATUS_INTERNAL;
#endif
}

cad_communicator_v1_t table() {
  cad_communicator_v1_t t{};
  t.struct_size = sizeof(t);
  t.last_error = last_error;
  t.get_rank = get_rank;
  t.get_world_size = get_world_size;
  t.get_device = get_device;
  t.all_to_all_v = all_to_all_v;
  t.all_gather = all_gather;
  t.barrier = barrier;
  return t;
}

bool have_gpu() {
#ifdef CAD_TEST_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

struct Value {
  int64_t a;
  int32_t b;
  int32_t c;
};

TEST(CadComm, CpuCommunicatorGetsTheCallersBuffers) {
  Fake fake;
  const cad_communicator_v1_t t = table();
  Comm comm(&t, &fake, "comm");
  const Value mine{1234567890123, -7, 42};
  const std::vector<Value> all = comm.all_gather_value(mine);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].a, mine.a);
  EXPECT_EQ(all[0].b, mine.b);
  EXPECT_EQ(all[0].c, mine.c);
  unsigned char peer[sizeof(Value)];
  std::memcpy(peer, &all[1], sizeof peer);
  for (unsigned char byte : peer) EXPECT_EQ(byte, kPeerByte);
  EXPECT_EQ(fake.calls, 1);
}

TEST(CadComm, AFailedGatherNamesTheInstanceTheRankAndTheCall) {
  Fake fake;
  fake.fail_gather = CAD_STATUS_COMMUNICATION;
  const cad_communicator_v1_t t = table();
  Comm comm(&t, &fake, "comm");
  try {
    comm.all_gather_value(Value{1, 2, 3});
    FAIL() << "a failed all_gather was taken as done";
  } catch (const Failure& e) {
    EXPECT_EQ(e.status(), CAD_STATUS_COMMUNICATION);
    EXPECT_EQ(std::string(e.what()),
              "communicator instance 'comm' (rank 0 of 2): all_gather failed: peer 1 did not answer");
  }
}

TEST(CadComm, DeviceCommunicatorIsNeverHandedHostMemory) {
  Fake fake;
  fake.device_type = CAD_DEVICE_CUDA;
  const cad_communicator_v1_t t = table();
  Comm comm(&t, &fake, "comm");
  const Value mine{-5, 6, 7};
  if (!have_gpu()) {
    // No GPU (or no CUDA in this build): refused before the communicator sees anything.
    try {
      comm.all_gather_value(mine);
      FAIL() << "a device communicator's all_gather ran without a GPU";
    } catch (const Failure& e) {
#ifdef CAD_TEST_CUDA
      EXPECT_EQ(e.status(), CAD_STATUS_DEVICE_ERROR) << e.what();
      EXPECT_NE(std::string(e.what()).find("CUDA device 0"), std::string::npos) << e.what();
#else
      EXPECT_EQ(e.status(), CAD_STATUS_UNSUPPORTED) << e.what();
      EXPECT_NE(std::string(e.what()).find("CAD_ENABLE_CUDA=OFF"), std::string::npos) << e.what();
#endif
    }
    EXPECT_EQ(fake.calls, 0);
    return;
  }
  for (int round = 0; round < 3; ++round) {  // the staging buffer is reused, and grown below
    const std::vector<Value> all = comm.all_gather_value(Value{mine.a + round, mine.b, mine.c});
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].a, mine.a + round);
    EXPECT_EQ(all[0].c, mine.c);
  }
  std::vector<char> large(1 << 20, 3), out(2 << 20);
  comm.all_gather(large.data(), large.size(), out.data());
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[(1 << 20) - 1], 3);
  EXPECT_EQ(static_cast<unsigned char>(out[1 << 20]), kPeerByte);
  EXPECT_TRUE(fake.saw_device_pointers);
  EXPECT_TRUE(fake.saw_stream);
  EXPECT_NE(fake.last_send, static_cast<const void*>(large.data()));
  EXPECT_EQ(fake.zero_byte_calls, 4);  // one status check after every staged collective
}

TEST(CadComm, AnAbortedDeviceCollectiveFailsTheCall) {
  if (!have_gpu()) GTEST_SKIP() << "needs a GPU (the refusal without one is checked above)";
  Fake fake;
  fake.device_type = CAD_DEVICE_CUDA;
  fake.fail_zero_byte = CAD_STATUS_TIMEOUT;
  const cad_communicator_v1_t t = table();
  Comm comm(&t, &fake, "comm");
  try {
    comm.all_gather_value(Value{1, 2, 3});
    FAIL() << "a collective the communicator reports aborted was taken as done";
  } catch (const Failure& e) {
    EXPECT_EQ(e.status(), CAD_STATUS_TIMEOUT) << e.what();
    EXPECT_NE(std::string(e.what()).find("aborted after its timeout"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(rank 0 of 2): all_gather failed"), std::string::npos) << e.what();
  }
}

}  // namespace
