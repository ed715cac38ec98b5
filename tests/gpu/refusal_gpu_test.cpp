// refusal_gpu_test.cpp -- what the cuda backend refuses, with which status and message, and that a
// refused call leaves its outputs untouched; plus its capabilities and run-to-run determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_harness.h"

namespace cad::gpu_test {
namespace {

// One small valid forward problem on the GPU whose descriptors a test may then spoil.
struct SmallProblem {
  int64_t t = 48;
  int hq = 4, hkv = 2, d = 64;
  DeviceBuffer q{size_t(48) * 4 * 128 * 4}, k{size_t(48) * 2 * 128 * 4}, v{size_t(48) * 2 * 128 * 4};
  DeviceBuffer o{size_t(48) * 4 * 128 * 4}, lse{size_t(48) * 8 * 4};
  std::vector<cad_segment_v1_t> segments{{0, 20, 0, 30}, {20, 28, 30, 18}};
  Tensor tq, tk, tv, to, tl;
  cad_attention_forward_args_v1_t args{};

  explicit SmallProblem(int head_dim = 64, cad_dtype_v1_t dtype = kBf16, int heads_q = 4, int heads_kv = 2)
      : hq(heads_q), hkv(heads_kv), d(head_dim),
        tq(q.get(), CAD_DEVICE_CUDA, dtype, {t, heads_q, head_dim}),
        tk(k.get(), CAD_DEVICE_CUDA, dtype, {t, heads_kv, head_dim}),
        tv(v.get(), CAD_DEVICE_CUDA, dtype, {t, heads_kv, head_dim}),
        to(o.get(), CAD_DEVICE_CUDA, dtype, {t, heads_q, head_dim}),
        tl(lse.get(), CAD_DEVICE_CUDA, kF32, {heads_q, t}) {
    std::mt19937_64 rng(5);
    const auto host = random_bf16(q.bytes() / 2, rng, nullptr);
    cudaMemcpy(q.get(), host.data(), q.bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(k.get(), host.data(), k.bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(v.get(), host.data(), v.bytes(), cudaMemcpyHostToDevice);
    cudaMemset(o.get(), 0x5a, o.bytes());
    args.struct_size = sizeof(args);
    args.segments = segments.data();
    args.num_segments = 2;
    args.softmax_scale = 0.125f;
    args.causal = 0;
    args.q = &tq.t;
    args.k = &tk.t;
    args.v = &tv.t;
    args.o = &to.t;
    args.lse = &tl.t;
  }
  bool output_untouched() const {
    std::vector<unsigned char> host(o.bytes());
    cudaMemcpy(host.data(), o.get(), o.bytes(), cudaMemcpyDeviceToHost);
    for (unsigned char c : host) {
      if (c != 0x5a) return false;
    }
    return true;
  }
};

class CudaRefusals : public ::testing::Test {
 protected:
  AttentionPlugin gpu{plugin_path("cuda")};
  void SetUp() override { ASSERT_EQ(gpu.error(), ""); }
  cad_status_t forward(SmallProblem& p) { return gpu.table()->forward(gpu.ctx(), &p.args); }
};

TEST_F(CudaRefusals, CapabilitiesDescribeTheBackend) {
  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(gpu.table()->get_capabilities(gpu.ctx(), &caps), CAD_STATUS_OK);
  EXPECT_EQ(caps.device_type, CAD_DEVICE_CUDA);
  EXPECT_EQ(caps.dtype_mask, static_cast<uint32_t>(CAD_ATTENTION_DTYPE_BF16));
  EXPECT_EQ(caps.head_dim_mask, (1u << 3) | (1u << 7));
  EXPECT_EQ(caps.max_head_dim, 128);
  EXPECT_EQ(caps.min_compute_capability, 80);
  const uint32_t want = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA |
                        CAD_ATTENTION_CAP_SHARED_KV | CAD_ATTENTION_CAP_BACKWARD |
                        CAD_ATTENTION_CAP_WINDOW;
  EXPECT_EQ(caps.flags, want);
}

TEST_F(CudaRefusals, Fp32IsUnsupported) {
  SmallProblem p(64, kF32);
  EXPECT_EQ(forward(p), CAD_STATUS_UNSUPPORTED);
  EXPECT_NE(gpu.last_error().find("cuda backend: dtype fp32 not supported; use bf16"), std::string::npos)
      << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
}

// Sliding windows run (CAD_ATTENTION_CAP_WINDOW; their numbers: attention_gpu_test.cpp). A bad one is refused
// naming the field, before any output is written; unknown window_flags bits too. A caller built before ABI
// v1.2 (a 112-byte struct) has no window, whatever the bytes after its struct hold.
TEST_F(CudaRefusals, SlidingWindowsRunAndBadOnesAreRefused) {
  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(gpu.table()->get_capabilities(gpu.ctx(), &caps), CAD_STATUS_OK);
  EXPECT_NE(caps.flags & CAD_ATTENTION_CAP_WINDOW, 0u);
  SmallProblem p;
  p.args.window_flags = CAD_WINDOW_GIVEN;
  p.args.window_left = -2;
  EXPECT_EQ(forward(p), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(gpu.last_error().find("window_left must be -1"), std::string::npos) << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
  p.args.window_left = 3;
  p.args.causal = 1;
  p.args.window_right = 2;
  EXPECT_EQ(forward(p), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(gpu.last_error().find("window_right must be -1 or 0 when causal"), std::string::npos) << gpu.last_error();
  p.args.window_right = -1;
  p.args.window_flags = CAD_WINDOW_GIVEN | 2u;
  EXPECT_EQ(forward(p), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(gpu.last_error().find("bits other than CAD_WINDOW_GIVEN"), std::string::npos) << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
  p.args.window_flags = CAD_WINDOW_GIVEN;
  p.args.causal = 0;  // segment 1 has more queries (28) than keys (18): no causal call takes it
  p.args.window_right = 2;
  EXPECT_EQ(forward(p), CAD_STATUS_OK) << gpu.last_error();
  p.segments[1].q_len = 18;  // now causal is valid: the causal window (3, -1)
  p.args.causal = 1;
  p.args.window_right = -1;
  EXPECT_EQ(forward(p), CAD_STATUS_OK) << gpu.last_error();
  p.args.struct_size = CAD_ATTENTION_FORWARD_ARGS_V1_1_SIZE;
  EXPECT_EQ(forward(p), CAD_STATUS_OK) << gpu.last_error();
}

// Windows at the int64 limits hide no key: the same O and LSE, bit for bit, as no window -- on a non-causal
// batch whose segment 1 has more queries (28) than keys (18), where `p - left` wraps for left = INT64_MAX.
// A struct whose struct_size ends before the window fields CAD_WINDOW_GIVEN promises is refused, naming the
// struct and its size, before any output is written.
TEST_F(CudaRefusals, WindowsAtTheInt64LimitsAndShortStructs) {
  constexpr int64_t kMax = INT64_MAX;
  SmallProblem p;
  const auto outputs = [&p] {
    std::vector<unsigned char> host(p.o.bytes() + p.lse.bytes());
    cudaDeviceSynchronize();
    cudaMemcpy(host.data(), p.o.get(), p.o.bytes(), cudaMemcpyDeviceToHost);
    cudaMemcpy(host.data() + p.o.bytes(), p.lse.get(), p.lse.bytes(), cudaMemcpyDeviceToHost);
    return host;
  };
  ASSERT_EQ(forward(p), CAD_STATUS_OK) << gpu.last_error();
  const std::vector<unsigned char> plain = outputs();
  struct Limit {
    int64_t left, right;
  };
  for (const Limit& w : {Limit{-1, kMax}, Limit{kMax, -1}, Limit{kMax, kMax}, Limit{kMax - 1, kMax - 1}}) {
    SCOPED_TRACE("window=(" + std::to_string(w.left) + ", " + std::to_string(w.right) + ")");
    cudaMemset(p.o.get(), 0x5a, p.o.bytes());
    p.args.window_flags = CAD_WINDOW_GIVEN;
    p.args.window_left = w.left;
    p.args.window_right = w.right;
    ASSERT_EQ(forward(p), CAD_STATUS_OK) << gpu.last_error();
    EXPECT_TRUE(outputs() == plain);
  }
  for (size_t size : {offsetof(cad_attention_forward_args_v1_t, window_flags) + 4,
                      offsetof(cad_attention_forward_args_v1_t, window_left),
                      offsetof(cad_attention_forward_args_v1_t, window_right)}) {
    cudaMemset(p.o.get(), 0x5a, p.o.bytes());
    p.args.struct_size = size;
    p.args.window_flags = CAD_WINDOW_GIVEN;
    EXPECT_EQ(forward(p), CAD_STATUS_ABI_MISMATCH) << size;
    EXPECT_NE(gpu.last_error().find("cad_attention_forward_args_v1_t.struct_size is " + std::to_string(size)),
              std::string::npos) << gpu.last_error();
    EXPECT_TRUE(p.output_untouched());
  }
  p.args.struct_size = offsetof(cad_attention_forward_args_v1_t, saved);  // inside the v1.1 fields
  p.args.window_flags = 0;
  EXPECT_EQ(forward(p), CAD_STATUS_ABI_MISMATCH);
  EXPECT_TRUE(p.output_untouched());
}

TEST_F(CudaRefusals, HeadDim96IsUnsupported) {
  SmallProblem p(96);
  EXPECT_EQ(forward(p), CAD_STATUS_UNSUPPORTED);
  EXPECT_NE(gpu.last_error().find("head dim D=96"), std::string::npos) << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
}

TEST_F(CudaRefusals, GqaNeedsDivisibleHeads) {
  SmallProblem p(64, kBf16, 6, 4);
  EXPECT_EQ(forward(p), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(gpu.last_error().find("Hq % Hkv == 0"), std::string::npos) << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
}

TEST_F(CudaRefusals, CpuTensorIsRefused) {
  SmallProblem p;
  std::vector<uint16_t> host(static_cast<size_t>(p.t) * p.hkv * p.d);
  Tensor cpu_k(host.data(), CAD_DEVICE_CPU, kBf16, {p.t, p.hkv, p.d});
  p.args.k = &cpu_k.t;
  EXPECT_EQ(forward(p), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(gpu.last_error().find("tensor 'k'"), std::string::npos) << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
}

TEST_F(CudaRefusals, MisalignedTensorIsRefused) {
  // TMA and cp.async read 16-byte chunks: a view starting 2 bytes into a buffer is refused, not misread.
  SmallProblem p;
  p.tv.t.byte_offset = 2;  // the buffer has room to spare behind the view
  EXPECT_EQ(forward(p), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(gpu.last_error().find("tensor 'v'"), std::string::npos) << gpu.last_error();
  EXPECT_NE(gpu.last_error().find("16-byte aligned"), std::string::npos) << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
}

TEST_F(CudaRefusals, SegmentOutOfRangeIsRefused) {
  SmallProblem p;
  p.segments[1].kv_len = 1000;
  EXPECT_EQ(forward(p), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(gpu.last_error().find("segment 1"), std::string::npos) << gpu.last_error();
  EXPECT_TRUE(p.output_untouched());
}

TEST_F(CudaRefusals, PiecesAreUnsupported) {
  SmallProblem p;
  cad_piece_v1_t piece{0, 10, 0, 10};
  p.args.pieces = &piece;
  p.args.num_pieces = 1;
  EXPECT_EQ(forward(p), CAD_STATUS_UNSUPPORTED);
  EXPECT_TRUE(p.output_untouched());
}

TEST_F(CudaRefusals, UnknownConfigKeyWarnsButBadDeviceFails) {
  AttentionPlugin warned(plugin_path("cuda"), R"({"no_such_key": 1})");
  EXPECT_EQ(warned.error(), "");
  AttentionPlugin bad(plugin_path("cuda"), R"({"device": 4096})");
  EXPECT_NE(bad.error().find("device"), std::string::npos) << bad.error();
}

TEST_F(CudaRefusals, BadForwardWalkAndReserveAreRefusedNamingTheKey) {
  AttentionPlugin walk(plugin_path("cuda"), R"({"forward_walk": "greedy"})");
  EXPECT_NE(walk.error().find("forward_walk"), std::string::npos) << walk.error();
  AttentionPlugin reserve(plugin_path("cuda"), R"({"reserve_sms": -1})");
  EXPECT_NE(reserve.error().find("reserve_sms"), std::string::npos) << reserve.error();
  AttentionPlugin both(plugin_path("cuda"), R"({"forward_walk": "dynamic", "reserve_sms": 16})");
  EXPECT_EQ(both.error(), "");
}

TEST_F(CudaRefusals, ForwardIsDeterministic) {
  SmallProblem p(128, kBf16, 8, 2);
  p.args.causal = 1;
  p.segments = {{0, 20, 0, 30}, {20, 18, 30, 18}};
  ASSERT_EQ(forward(p), CAD_STATUS_OK) << gpu.last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> first(p.o.bytes()), second(p.o.bytes());
  cudaMemcpy(first.data(), p.o.get(), p.o.bytes(), cudaMemcpyDeviceToHost);
  cudaMemset(p.o.get(), 0x5a, p.o.bytes());
  ASSERT_EQ(forward(p), CAD_STATUS_OK) << gpu.last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(second.data(), p.o.get(), p.o.bytes(), cudaMemcpyDeviceToHost);
  EXPECT_EQ(first, second);
  EXPECT_FALSE(p.output_untouched());
}

}  // namespace
}  // namespace cad::gpu_test
