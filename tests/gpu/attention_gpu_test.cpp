// attention_gpu_test.cpp -- drives cad_cuda.so through its ABI on random varlen batches and compares
// O, LSE, dQ, dK, dV with the CPU reference backend (cad_reference.so, fp32 on the same bf16-rounded
// inputs). Batches: tiny segments (1..17 tokens, gaps of uncovered/unread rows, empty KV), CAD-style
// tasks sharing their document's KV prefix, and short queries against long KV (split-KV path).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cad_kernels.h"
#include "gpu_harness.h"

namespace cad::gpu_test {
namespace {

struct Batch {
  int64_t tq = 0, tk = 0;
  std::vector<cad_segment_v1_t> segments;
};

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Many tiny segments with rows between them that no segment covers or reads.
Batch tiny_segments(std::mt19937_64& rng, bool causal) {
  Batch b;
  for (int i = 0; i < 24; ++i) {
    b.tq += uniform(rng, 0, 3);
    b.tk += uniform(rng, 0, 3);
    const int64_t q_len = uniform(rng, 1, 17);
    const int64_t kv_len = causal ? q_len + uniform(rng, 0, 17) : uniform(rng, 0, 17);
    b.segments.push_back({b.tq, q_len, b.tk, kv_len});
    b.tq += q_len;
    b.tk += kv_len;
  }
  b.tq += 2;
  b.tk += 2;
  return b;
}

// Documents cut into CAD tasks that share the document's KV: task [qb, qe) attends to keys [0, qe)
// (causal) or [0, L) of its document.
Batch shared_kv(std::mt19937_64& rng, bool causal) {
  Batch b;
  std::vector<cad_segment_v1_t> tasks;
  for (int doc = 0; doc < 5; ++doc) {
    const int64_t len = uniform(rng, 1, 300);
    const int64_t kv_offset = b.tk;
    b.tk += len;
    int64_t qb = 0;
    while (qb < len) {
      const int64_t qe = std::min(len, qb + uniform(rng, 1, 160));
      tasks.push_back({0, qe - qb, kv_offset, causal ? qe : len});
      qb = qe;
    }
  }
  std::shuffle(tasks.begin(), tasks.end(), rng);
  for (cad_segment_v1_t& s : tasks) {
    s.q_offset = b.tq;
    b.tq += s.q_len;
    b.segments.push_back(s);
  }
  return b;
}

// Short query shards against long KV prefixes (the forward splits their KV range), one of them
// sharing its prefix with another.
Batch long_kv(std::mt19937_64& rng, bool causal) {
  Batch b;
  for (int i = 0; i < 3; ++i) {
    const int64_t kv_len = uniform(rng, 600, 2600);
    const int64_t q_len = uniform(rng, 40, 200);
    b.segments.push_back({b.tq, q_len, b.tk, kv_len});
    b.tq += q_len;
    if (i == 1) {  // a second shard of the same document: a shorter prefix of the same KV
      const int64_t q2 = uniform(rng, 1, 64);
      b.segments.push_back({b.tq, q2, b.tk, causal ? kv_len - q_len : kv_len});
      b.tq += q2;
    }
    b.tk += kv_len;
  }
  return b;
}

enum class Kind { kTiny, kSharedKv, kLongKv };
const char* kind_name(Kind k) { return k == Kind::kTiny ? "tiny" : k == Kind::kSharedKv ? "shared_kv" : "long_kv"; }
Batch make_batch(Kind k, std::mt19937_64& rng, bool causal) {
  return k == Kind::kTiny ? tiny_segments(rng, causal) : k == Kind::kSharedKv ? shared_kv(rng, causal) : long_kv(rng, causal);
}

struct Case {
  Kind kind;
  int head_dim;
  bool causal;
  int hq, hkv;
};

std::vector<float> download_bf16(const DeviceBuffer& buf, size_t n) {
  std::vector<uint16_t> host(n);
  if (n) cudaMemcpy(host.data(), buf.get(), n * 2, cudaMemcpyDeviceToHost);
  return bf16_vector_to_float(host);
}
std::vector<float> download_f32(const DeviceBuffer& buf, size_t n) {
  std::vector<float> host(n);
  if (n) cudaMemcpy(host.data(), buf.get(), n * 4, cudaMemcpyDeviceToHost);
  return host;
}

// LSE rows match when both are -inf or they differ by at most 1e-3 (relative to max(1, |ref|)).
double lse_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) && want[i] < 0) {
      if (!(std::isinf(got[i]) && got[i] < 0)) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) / std::max(1.0, std::fabs(double(want[i]))));
  }
  return worst;
}

// One call's device tensors: the bf16 inputs uploaded, every output poisoned (0xff bytes = NaN) so that
// unwritten elements show.
struct OnDevice {
  DeviceBuffer q, k, v, d_o, o, lse, dq, dk, dv;
  OnDevice(const std::vector<uint16_t>& q_host, const std::vector<uint16_t>& k_host, const std::vector<uint16_t>& v_host,
           const std::vector<uint16_t>& d_o_host, size_t nl)
      : q(q_host.size() * 2), k(k_host.size() * 2), v(v_host.size() * 2), d_o(d_o_host.size() * 2),
        o(q_host.size() * 2), lse(nl * 4), dq(q_host.size() * 2), dk(k_host.size() * 2), dv(v_host.size() * 2) {
    cudaMemcpy(q.get(), q_host.data(), q.bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(k.get(), k_host.data(), k.bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(v.get(), v_host.data(), v.bytes(), cudaMemcpyHostToDevice);
    cudaMemcpy(d_o.get(), d_o_host.data(), d_o.bytes(), cudaMemcpyHostToDevice);
    for (DeviceBuffer* out : {&o, &lse, &dq, &dk, &dv}) cudaMemset(out->get(), 0xff, out->bytes());
    // The memsets run on the legacy default stream, which a cudaStreamNonBlocking stream (the calls') does not
    // wait for: without this, a poison fill delayed on a shared GPU could land after the kernels' writes (seen as
    // NaN LSE in uncovered rows, where fill_uncovered wrote -inf early, with several test processes on one GPU).
    cudaDeviceSynchronize();
  }
  AttentionData data() {
    return {q.get(), k.get(), v.get(), o.get(), d_o.get(), dq.get(), dk.get(), dv.get(), static_cast<float*>(lse.get())};
  }
};

// The last parameter picks the kernels, forward and backward, at both head dims: true = the default
// (wgmma on Hopper), false = the portable mma.sync kernels forced through the config.
class AttentionVsReference
    : public ::testing::TestWithParam<std::tuple<Kind, int, bool, std::pair<int, int>, bool>> {};

// One forward + backward of the cuda backend against the CPU reference on `kind` batches (3 seeds). hopper:
// the backend's default kernels (else the portable ones, through the config). A window (either limit >= 0)
// that hides a key of the batch runs on the portable kernels.
void compare_with_reference(Kind kind, int d, bool causal, int hq, int hkv, bool hopper, int64_t window_left = -1,
                            int64_t window_right = -1) {
  const bool windowed = window_left >= 0 || window_right >= 0;
  AttentionPlugin gpu(plugin_path("cuda"), hopper ? "{}" : R"({"hopper_kernels": false})");
  ASSERT_EQ(gpu.error(), "");
  AttentionPlugin ref(plugin_path("reference"));
  ASSERT_EQ(ref.error(), "");

  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed * 1000 + d + (causal ? 7 : 0) + static_cast<int>(kind) * 100 + hq +
                        // unsigned: the window may sit at the int64 limits
                        (windowed ? 31 * static_cast<uint64_t>(window_left) + 17 * static_cast<uint64_t>(window_right) +
                                        5000 : 0));
    const Batch b = make_batch(kind, rng, causal);
    const size_t nq = static_cast<size_t>(b.tq) * hq * d, nk = static_cast<size_t>(b.tk) * hkv * d;
    const size_t nl = static_cast<size_t>(b.tq) * hq;
    std::vector<float> qf, kf, vf, dof;
    const auto q = random_bf16(nq, rng, &qf), k = random_bf16(nk, rng, &kf), v = random_bf16(nk, rng, &vf);
    const auto d_o = random_bf16(nq, rng, &dof);

    // ---- GPU
    OnDevice dev(q, k, v, d_o, nl);
    cudaStream_t stream;
    CAD_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const AttentionShape shape{b.tq, b.tk, hq, hkv, d, window_left, window_right};
    ASSERT_EQ(run_attention(gpu, b.segments, shape, causal, CAD_DEVICE_CUDA, kBf16, dev.data(), stream), "");
    {
      // The backward runs the kernels the forward runs: the Hopper ones unless the config forbids them,
      // windowed or not (they mask windows; a window that hides no key of the batch is no window: the plans
      // drop it). (A call without a plan once fell back to the portable backward silently.)
      char stats[1024];
      size_t needed = 0;
      ASSERT_EQ(gpu.table()->get_stats_json(gpu.ctx(), stats, sizeof stats, &needed), CAD_STATUS_OK);
      const std::string json(stats);
      const bool sm90 = json.find("\"forward_kernel\":\"wgmma_sm90a\"") != std::string::npos;
      EXPECT_EQ(sm90, hopper && cad::kernels::hopper_kernels_available()) << json;
      EXPECT_NE(json.find(sm90 ? "\"backward_kernel\":\"wgmma_sm90a\"" : "\"backward_kernel\":\"mma_sync\""),
                std::string::npos)
          << json;
    }
    CAD_CHECK_CUDA(cudaGetLastError());
    EXPECT_EQ(gpu.outstanding_device_bytes(), 0) << "workspace not handed back";
    const auto o_gpu = download_bf16(dev.o, nq), lse_gpu = download_f32(dev.lse, nl);
    const auto dq_gpu = download_bf16(dev.dq, nq), dk_gpu = download_bf16(dev.dk, nk);
    const auto dv_gpu = download_bf16(dev.dv, nk);
    cudaStreamDestroy(stream);

    // ---- CPU reference in fp32 on the same (bf16-rounded) values.
    std::vector<float> o_ref(nq), lse_ref(nl), dq_ref(nq), dk_ref(nk), dv_ref(nk);
    const AttentionData on_cpu{qf.data(), kf.data(), vf.data(), o_ref.data(), dof.data(),
                               dq_ref.data(), dk_ref.data(), dv_ref.data(), lse_ref.data()};
    ASSERT_EQ(run_attention(ref, b.segments, shape, causal, CAD_DEVICE_CPU, kF32, on_cpu, nullptr), "");

    // A window of one key (left 0, and right 0 or causal): every query's softmax has a single entry, whatever
    // its score, so dQ and dK are exactly zero and the reference's are all zeros. The kernels' are rounding
    // noise (~1e-6: P = exp(S - LSE) is 1 within an ulp, and dS = P (dP - Delta) subtracts dP = dO.V summed by
    // the MMA from Delta = rowsum(dO * O) summed elsewhere, O = V), which an error relative to an all-zero
    // reference makes inf. They are held to an absolute bound there instead: 1e-2 of a scale of 1e-2.
    const bool one_key = window_left == 0 && (causal || window_right == 0);
    const double grad_scale = one_key ? 1e-2 : 0;
    const double e_o = max_relative_error(o_gpu, o_ref), e_lse = lse_error(lse_gpu, lse_ref);
    const double e_dq = max_relative_error(dq_gpu, dq_ref, grad_scale);
    const double e_dk = max_relative_error(dk_gpu, dk_ref, grad_scale);
    const double e_dv = max_relative_error(dv_gpu, dv_ref);
    std::printf("[%s%s d=%d causal=%d hq=%d hkv=%d window=(%lld,%lld) seed=%llu] tq=%lld tk=%lld segs=%zu  O %.2e  "
                "LSE %.2e  dQ %.2e  dK %.2e  dV %.2e\n",
                kind_name(kind), hopper ? "" : "/portable", d, causal ? 1 : 0, hq, hkv,
                static_cast<long long>(window_left), static_cast<long long>(window_right),
                static_cast<unsigned long long>(seed), static_cast<long long>(b.tq), static_cast<long long>(b.tk),
                b.segments.size(), e_o, e_lse, e_dq, e_dk, e_dv);
    EXPECT_LE(e_o, 1e-2);
    EXPECT_LE(e_lse, 1e-3);
    EXPECT_LE(e_dq, 1e-2);
    EXPECT_LE(e_dk, 1e-2);
    EXPECT_LE(e_dv, 1e-2);
  }
}

TEST_P(AttentionVsReference, MatchesReference) {
  const auto [kind, d, causal, heads, hopper] = GetParam();
  compare_with_reference(kind, d, causal, heads.first, heads.second, hopper);
}

std::string case_name(const ::testing::TestParamInfo<AttentionVsReference::ParamType>& info) {
  const auto [kind, d, causal, heads, hopper] = info.param;
  return std::string(kind_name(kind)) + "_d" + std::to_string(d) + (causal ? "_causal" : "_full") + "_h" +
         std::to_string(heads.first) + "x" + std::to_string(heads.second) + (hopper ? "" : "_portable");
}

INSTANTIATE_TEST_SUITE_P(Gpu, AttentionVsReference,
                         ::testing::Combine(::testing::Values(Kind::kTiny, Kind::kSharedKv, Kind::kLongKv),
                                            ::testing::Values(64, 128), ::testing::Bool(),
                                            ::testing::Values(std::make_pair(4, 4), std::make_pair(8, 2)),
                                            ::testing::Bool()),
                         case_name);

// Sliding windows (ABI v1.2) against the reference: causal windows (left only) and non-causal ones (either
// side), on the same batches (tiny segments with empty and uncovered rows, CAD tasks sharing their document's
// KV, split long KV), both head dims, GQA; asked of either kernel family, run on it -- a window longer than
// every segment (4000 > 2600 keys) hides nothing and runs as no window, and so does one at the int64 limits.
struct WindowCase {
  bool causal;
  int64_t left, right;
};
class WindowVsReference
    : public ::testing::TestWithParam<std::tuple<Kind, int, WindowCase, bool>> {};

TEST_P(WindowVsReference, MatchesReference) {
  const auto [kind, d, window, hopper] = GetParam();
  compare_with_reference(kind, d, window.causal, 8, 2, hopper, window.left, window.right);
}

std::string window_case_name(const ::testing::TestParamInfo<WindowVsReference::ParamType>& info) {
  const auto [kind, d, w, hopper] = info.param;
  const auto side = [](int64_t x) { return x < 0 ? std::string("none") : std::to_string(x); };
  return std::string(kind_name(kind)) + "_d" + std::to_string(d) + (w.causal ? "_causal" : "_full") + "_left" +
         side(w.left) + "_right" + side(w.right) + (hopper ? "" : "_portable");
}

INSTANTIATE_TEST_SUITE_P(Gpu, WindowVsReference,
                         ::testing::Combine(::testing::Values(Kind::kTiny, Kind::kSharedKv, Kind::kLongKv),
                                            ::testing::Values(64, 128),
                                            ::testing::Values(WindowCase{true, 0, -1}, WindowCase{true, 5, -1},
                                                              WindowCase{true, 100, -1}, WindowCase{true, 700, -1},
                                                              WindowCase{false, 3, 7}, WindowCase{false, -1, 20},
                                                              WindowCase{false, 50, -1}, WindowCase{false, 0, 0},
                                                              // longer than every segment: no window (wgmma)
                                                              WindowCase{true, 4000, -1},
                                                              WindowCase{false, 4000, 4000},
                                                              // at the int64 limits: no window either, never
                                                              // O = 0 or a key range computed from a wrapped sum
                                                              WindowCase{false, -1, INT64_MAX},
                                                              WindowCase{false, INT64_MAX, INT64_MAX},
                                                              WindowCase{true, INT64_MAX, -1}),
                                            ::testing::Bool()),
                         window_case_name);

// The Hopper forward's dynamic walk (the cuda backend's forward_walk: each block takes the next untaken unit)
// computes every unit as the static walk does, so O and LSE are bitwise the same: on the full grid, and on a grid
// of one block (reserve_sms past the device's SMs), whose producer hands every unit of the batch to its consumers
// through the two slots in turn. (The backward, the same in both, sums dQ in whatever order its blocks end: not
// compared bitwise.)
struct Outputs {
  std::vector<float> o, lse;
};

void run_on(const char* config, const Batch& b, int d, bool causal, int hq, int hkv, int64_t window_left, uint64_t seed,
            Outputs* out) {
  AttentionPlugin gpu(plugin_path("cuda"), config);
  EXPECT_EQ(gpu.error(), "") << config;
  std::mt19937_64 rng(seed);
  const size_t nq = static_cast<size_t>(b.tq) * hq * d, nk = static_cast<size_t>(b.tk) * hkv * d;
  const size_t nl = static_cast<size_t>(b.tq) * hq;
  const auto q = random_bf16(nq, rng, nullptr), k = random_bf16(nk, rng, nullptr), v = random_bf16(nk, rng, nullptr);
  const auto d_o = random_bf16(nq, rng, nullptr);
  OnDevice dev(q, k, v, d_o, nl);
  cudaStream_t stream;
  CAD_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const AttentionShape shape{b.tq, b.tk, hq, hkv, d, window_left, -1};
  EXPECT_EQ(run_attention(gpu, b.segments, shape, causal, CAD_DEVICE_CUDA, kBf16, dev.data(), stream), "") << config;
  CAD_CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  *out = {download_bf16(dev.o, nq), download_f32(dev.lse, nl)};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

class DynamicWalk : public ::testing::TestWithParam<std::tuple<Kind, int, bool, int64_t>> {};

TEST_P(DynamicWalk, SameOutputsAsTheStaticWalk) {
  if (!cad::kernels::hopper_kernels_available()) GTEST_SKIP() << "no sm_90a kernels on this device";
  const auto [kind, d, causal, window_left] = GetParam();
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed * 31 + d + (causal ? 3 : 0) + static_cast<int>(kind) * 7);
    const Batch b = make_batch(kind, rng, causal);
    for (const auto& [fixed, taken] :
         {std::pair<const char*, const char*>{R"({})", R"({"forward_walk": "dynamic"})"},
          {R"({"reserve_sms": 1024})", R"({"reserve_sms": 1024, "forward_walk": "dynamic"})"}}) {
      SCOPED_TRACE(taken);
      Outputs want, got;
      ASSERT_NO_FATAL_FAILURE(run_on(fixed, b, d, causal, 8, 2, window_left, seed, &want));
      ASSERT_NO_FATAL_FAILURE(run_on(taken, b, d, causal, 8, 2, window_left, seed, &got));
      // A forward that wrote nothing would leave the 0xff poison (NaN) in both: the static walk's O is finite.
      bool finite = true;
      for (float x : want.o) finite = finite && std::isfinite(x);
      EXPECT_TRUE(finite);
      EXPECT_TRUE(bitwise_equal(got.o, want.o));
      EXPECT_TRUE(bitwise_equal(got.lse, want.lse));
    }
  }
}

std::string walk_case_name(const ::testing::TestParamInfo<DynamicWalk::ParamType>& info) {
  const auto [kind, d, causal, left] = info.param;
  return std::string(kind_name(kind)) + "_d" + std::to_string(d) + (causal ? "_causal" : "_full") +
         (left >= 0 ? "_left" + std::to_string(left) : "");
}

INSTANTIATE_TEST_SUITE_P(Gpu, DynamicWalk,
                         ::testing::Combine(::testing::Values(Kind::kTiny, Kind::kSharedKv, Kind::kLongKv),
                                            ::testing::Values(64, 128), ::testing::Bool(),
                                            ::testing::Values(int64_t{-1}, int64_t{100})),
                         walk_case_name);

}  // namespace
}  // namespace cad::gpu_test
