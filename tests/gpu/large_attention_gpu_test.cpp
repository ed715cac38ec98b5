// large_attention_gpu_test.cpp -- correctness of the cuda backend at benchmark scale (16K-64K-token dense
// batches, split-KV shards on 32K-128K-key prefixes, CAD's shared-KV head+tail pair, a ragged Pretrain-like
// buffer; head dims 64 and 128), against the GPU fp32 oracle of fp32_reference.h. The backend is driven
// through its ABI (cad_cuda.so with its default config, what users run, then with the portable kernels), on
// bf16 inputs generated on the GPU, with every output pre-filled with NaN. First, the oracle itself is
// checked against the CPU reference backend (cad_reference.so) on small random batches, so that the large
// comparisons rest on a trusted oracle.
//
// One line per case and kernel set: "[large NAME d=D ... kernels=K] O e LSE e dQ e dK e dV e ..." (errors:
// max abs error / max abs reference; LSE: max |error| / max(1, |ref|)), the time of the backend and oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "device_checks.h"
#include "fp32_reference.h"
#include "gpu_harness.h"

namespace cad::gpu_test {
namespace {

struct Batch {
  int64_t tq = 0, tk = 0;
  std::vector<cad_segment_v1_t> segments;
};

struct Heads {
  int hq, hkv, d;
};

// Rows of Q some segment covers and rows of K/V some segment reads (a causal segment's last query sees
// all its keys, so a segment with queries reads its whole KV range).
void row_masks(const Batch& b, std::vector<uint8_t>* covered, std::vector<uint8_t>* read) {
  covered->assign(static_cast<size_t>(b.tq), 0);
  read->assign(static_cast<size_t>(b.tk), 0);
  for (const cad_segment_v1_t& s : b.segments) {
    std::fill_n(covered->begin() + s.q_offset, s.q_len, 1);
    if (s.q_len > 0) std::fill_n(read->begin() + s.kv_offset, s.kv_len, 1);
  }
}

// Score entries per head (query-key pairs that attend).
double attended_pairs(const Batch& b, bool causal) {
  double pairs = 0;
  for (const cad_segment_v1_t& s : b.segments) {
    const double q = static_cast<double>(s.q_len), kv = static_cast<double>(s.kv_len);
    pairs += causal ? q * (kv - q) + q * (q + 1) / 2 : q * kv;
  }
  return pairs;
}

AttentionShape shape(const Batch& b, const Heads& h) { return AttentionShape{b.tq, b.tk, h.hq, h.hkv, h.d}; }

std::unique_ptr<DeviceBuffer> device_buffer(size_t bytes) { return std::make_unique<DeviceBuffer>(bytes); }

class Stream {
 public:
  Stream() { ok_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess; }
  ~Stream() {
    if (ok_) cudaStreamDestroy(stream_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  bool ok() const { return ok_; }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  bool ok_ = false;
};

// The oracle's forward and backward on fp32 device tensors.
cudaError_t run_reference(const Batch& b, const Heads& h, bool causal, const AttentionData& x, cudaStream_t stream) {
  ReferenceBatch rb;
  rb.tq = b.tq;
  rb.tk = b.tk;
  rb.hq = h.hq;
  rb.hkv = h.hkv;
  rb.head_dim = h.d;
  rb.softmax_scale = 1.f / std::sqrt(static_cast<float>(h.d));
  rb.causal = causal;
  rb.segments = b.segments.data();
  rb.num_segments = static_cast<int64_t>(b.segments.size());
  const auto f = [](void* p) { return static_cast<float*>(p); };
  const cudaError_t e = reference_forward(rb, f(x.q), f(x.k), f(x.v), f(x.o), x.lse, stream);
  if (e != cudaSuccess) return e;
  return reference_backward(rb, f(x.q), f(x.k), f(x.v), f(x.o), x.lse, f(x.d_o), f(x.d_q), f(x.d_k), f(x.d_v), stream);
}

// The five outputs of `got` (bf16 when got_bf16, else fp32) against `want` (fp32), all on the device.
struct Errors {
  TensorCheck o, lse, dq, dk, dv;
};

cudaError_t compare(const Batch& b, const Heads& h, const AttentionData& got, bool got_bf16, const AttentionData& want,
                    const uint8_t* covered, const uint8_t* read, cudaStream_t stream, Errors* e) {
  const auto rows = [&](void* g, void* w, int64_t n, int64_t width, const uint8_t* mask, TensorCheck* out) {
    return check_rows(got_bf16 ? static_cast<const uint16_t*>(g) : nullptr, got_bf16 ? nullptr : static_cast<const float*>(g),
                      static_cast<const float*>(w), n, width, mask, stream, out);
  };
  cudaError_t err = rows(got.o, want.o, b.tq, int64_t{h.hq} * h.d, covered, &e->o);
  if (err == cudaSuccess) err = check_lse(got.lse, want.lse, h.hq, b.tq, covered, stream, &e->lse);
  if (err == cudaSuccess) err = rows(got.d_q, want.d_q, b.tq, int64_t{h.hq} * h.d, covered, &e->dq);
  if (err == cudaSuccess) err = rows(got.d_k, want.d_k, b.tk, int64_t{h.hkv} * h.d, read, &e->dk);
  if (err == cudaSuccess) err = rows(got.d_v, want.d_v, b.tk, int64_t{h.hkv} * h.d, read, &e->dv);
  return err;
}

void expect_within(const Errors& e, double limit, double lse_limit) {
  const std::pair<const char*, const TensorCheck*> all[] = {{"O", &e.o}, {"LSE", &e.lse}, {"dQ", &e.dq}, {"dK", &e.dk}, {"dV", &e.dv}};
  for (const auto& [name, c] : all) {
    SCOPED_TRACE(name);
    EXPECT_EQ(c->non_finite, 0) << "non-finite values where the reference is finite";
    EXPECT_EQ(c->wrong_exact, 0) << "rows no segment covers/reads (or LSE rows with no key) not exactly 0 / -inf";
    EXPECT_EQ(c->reference_bad, 0) << "the reference itself is non-finite, or not 0 / -inf where nothing is defined";
    if (c == &e.lse) {
      EXPECT_LE(c->max_error, lse_limit);
    } else {
      EXPECT_GT(c->max_reference, 0) << "a reference of zeros compares nothing";
      EXPECT_LE(c->relative(), limit);
    }
  }
}

std::string format_errors(const Errors& e) {
  char line[256];
  std::snprintf(line, sizeof(line), "O %.2e  LSE %.2e  dQ %.2e  dK %.2e  dV %.2e", e.o.relative(), e.lse.max_error,
                e.dq.relative(), e.dk.relative(), e.dv.relative());
  return line;
}

// ---- the oracle against the CPU reference backend -------------------------------------------------------

// Segments of 1..150 queries with gaps (uncovered Q rows, unread K/V rows, KV offsets not aligned to the
// oracle's 64-row tiles), about a third sharing the previous segment's KV rows, and (non-causal) one
// segment with no keys at all.
Batch small_batch(std::mt19937_64& rng, bool causal) {
  const auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Batch b;
  for (int s = 0; s < 8; ++s) {
    b.tq += uniform(0, 5);
    const int64_t q_len = uniform(1, 150);
    cad_segment_v1_t seg{b.tq, q_len, 0, 0};
    const bool share = s > 0 && s != 2 && uniform(0, 2) == 0 && (!causal || b.segments.back().kv_len >= q_len);
    if (share) {
      seg.kv_offset = b.segments.back().kv_offset;
      seg.kv_len = uniform(causal ? q_len : 0, b.segments.back().kv_len);
    } else {
      b.tk += uniform(0, 70);
      seg.kv_offset = b.tk;
      seg.kv_len = causal ? q_len + uniform(0, 150) : (s == 2 ? 0 : uniform(1, 200));
      b.tk += seg.kv_len;
    }
    b.segments.push_back(seg);
    b.tq += q_len;
  }
  b.tq += 3;
  b.tk += 3;
  return b;
}

class ReferenceVsCpu : public ::testing::TestWithParam<std::tuple<int, bool, std::pair<int, int>>> {};

TEST_P(ReferenceVsCpu, MatchesCpuReference) {
  const auto [d, causal, heads] = GetParam();
  const Heads h{heads.first, heads.second, d};
  AttentionPlugin cpu(plugin_path("reference"));
  ASSERT_EQ(cpu.error(), "");
  Stream stream;
  ASSERT_TRUE(stream.ok()) << "cudaStreamCreateWithFlags failed: no usable GPU?";
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed * 7919 + static_cast<uint64_t>(d) + (causal ? 1 : 0) * 31 + static_cast<uint64_t>(h.hq));
    const Batch b = small_batch(rng, causal);
    const size_t nq = static_cast<size_t>(b.tq) * h.hq * d, nk = static_cast<size_t>(b.tk) * h.hkv * d;
    const size_t nl = static_cast<size_t>(b.tq) * h.hq;
    std::vector<float> q, k, v, d_o;
    random_bf16(nq, rng, &q);
    random_bf16(nk, rng, &k);
    random_bf16(nk, rng, &v);
    random_bf16(nq, rng, &d_o);

    // CPU reference (fp32 on the host).
    std::vector<float> o(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    const AttentionData host{q.data(), k.data(), v.data(), o.data(), d_o.data(), dq.data(), dk.data(), dv.data(), lse.data()};
    ASSERT_EQ(run_attention(cpu, b.segments, shape(b, h), causal, CAD_DEVICE_CPU, kF32, host, nullptr), "");

    // Everything to the device: the inputs for the oracle, the CPU's outputs to compare with.
    const std::vector<const std::vector<float>*> sources = {&q, &k, &v, &o, &d_o, &dq, &dk, &dv, &lse};
    std::vector<std::unique_ptr<DeviceBuffer>> cpu_side, oracle_side;
    for (const std::vector<float>* src : sources) {
      cpu_side.push_back(device_buffer(src->size() * sizeof(float)));
      oracle_side.push_back(device_buffer(src->size() * sizeof(float)));
      ASSERT_TRUE(src->empty() || (cpu_side.back()->get() && oracle_side.back()->get())) << "cudaMalloc failed";
      CAD_CHECK_CUDA(cudaMemcpy(cpu_side.back()->get(), src->data(), src->size() * sizeof(float), cudaMemcpyHostToDevice));
      CAD_CHECK_CUDA(cudaMemset(oracle_side.back()->get(), 0xff, oracle_side.back()->bytes()));  // NaN
    }
    for (int input : {0, 1, 2, 4}) {  // q, k, v, dO
      CAD_CHECK_CUDA(cudaMemcpy(oracle_side[input]->get(), cpu_side[input]->get(), cpu_side[input]->bytes(),
                                cudaMemcpyDeviceToDevice));
    }
    const auto data = [](const std::vector<std::unique_ptr<DeviceBuffer>>& t) {
      return AttentionData{t[0]->get(), t[1]->get(), t[2]->get(), t[3]->get(), t[4]->get(),
                           t[5]->get(), t[6]->get(), t[7]->get(), static_cast<float*>(t[8]->get())};
    };
    CAD_CHECK_CUDA(run_reference(b, h, causal, data(oracle_side), stream.get()));

    std::vector<uint8_t> covered, read;
    row_masks(b, &covered, &read);
    const auto covered_d = device_buffer(covered.size()), read_d = device_buffer(read.size());
    CAD_CHECK_CUDA(cudaMemcpy(covered_d->get(), covered.data(), covered.size(), cudaMemcpyHostToDevice));
    CAD_CHECK_CUDA(cudaMemcpy(read_d->get(), read.data(), read.size(), cudaMemcpyHostToDevice));
    Errors e;
    CAD_CHECK_CUDA(compare(b, h, data(oracle_side), false, data(cpu_side), static_cast<const uint8_t*>(covered_d->get()),
                           static_cast<const uint8_t*>(read_d->get()), stream.get(), &e));
    std::printf("[oracle d=%d causal=%d hq=%d hkv=%d seed=%llu] tq=%lld tk=%lld segs=%zu  %s\n", d, causal ? 1 : 0, h.hq,
                h.hkv, static_cast<unsigned long long>(seed), static_cast<long long>(b.tq), static_cast<long long>(b.tk),
                b.segments.size(), format_errors(e).c_str());
    // Two fp32 implementations summing in different orders: far below the bf16 limits of the large cases.
    expect_within(e, 1e-4, 1e-5);
  }
}

std::string oracle_case_name(const ::testing::TestParamInfo<ReferenceVsCpu::ParamType>& info) {
  const auto [d, causal, heads] = info.param;
  return "d" + std::to_string(d) + (causal ? "_causal" : "_full") + "_h" + std::to_string(heads.first) + "x" +
         std::to_string(heads.second);
}

INSTANTIATE_TEST_SUITE_P(Gpu, ReferenceVsCpu,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Bool(),
                                            ::testing::Values(std::make_pair(4, 4), std::make_pair(8, 2))),
                         oracle_case_name);

// ---- benchmark-scale batches -------------------------------------------------------------------------------

Batch dense_16k() { return Batch{16384, 16384, {{0, 16384, 0, 16384}}}; }
Batch dense_64k() { return Batch{65536, 65536, {{0, 65536, 0, 65536}}}; }

// Short query shards at the end of long KV prefixes, each its own document (what CAD sends a server for the
// tail of a long document; the forward splits their KV ranges across SMs).
Batch shards() {
  Batch b;
  const std::pair<int64_t, int64_t> shapes[] = {{1024, 32768}, {1024, 65536}, {128, 65536}, {128, 131072}};
  for (const auto& [q_len, kv_len] : shapes) {
    b.segments.push_back({b.tq, q_len, b.tk, kv_len});
    b.tq += q_len;
    b.tk += kv_len;
  }
  return b;
}

// CAD's task pair: the head shard of a long document (its first S tokens, seeing keys [0, S)) and its tail
// shard (the last S tokens, seeing the whole document) read the same K/V rows. Two documents, with Q rows
// no segment covers and K/V rows no segment reads between them.
Batch head_tail() {
  Batch b;
  const std::pair<int64_t, int64_t> documents[] = {{131072, 2048}, {32768, 4096}};
  for (const auto& [len, shard] : documents) {
    b.segments.push_back({b.tq, shard, b.tk, shard});
    b.tq += shard;
    b.segments.push_back({b.tq, shard, b.tk, len});
    b.tq += shard + 19;
    b.tk += len + 37;
  }
  return b;
}

// A Pretrain-like buffer of 64K tokens: documents with log-normal lengths (median 600 tokens, clamped to
// [16, 24K]: many short ones and a long tail) packed in order, each attending to itself; the last 300 rows
// are padding that no segment covers or reads.
Batch ragged_64k() {
  std::mt19937_64 rng(20261125);
  std::lognormal_distribution<double> length(std::log(600.0), 1.3);
  Batch b{65536, 65536, {}};
  const int64_t filled = b.tq - 300;
  for (int64_t at = 0; at < filled;) {
    const int64_t len = std::min(filled - at, std::clamp<int64_t>(std::llround(length(rng)), 16, 24576));
    b.segments.push_back({at, len, at, len});
    at += len;
  }
  return b;
}

struct LargeCase {
  const char* name;
  Batch (*make)();
  bool causal;
  int hq, hkv;
};

// Heads are chosen so that the whole program stays within about a minute on one H100 (the oracle is fp32
// SIMT); 32/8 (the benchmark's) where the batch is small enough.
const LargeCase kCases[] = {
    {"dense_causal_16k", dense_16k, true, 32, 8},
    {"dense_full_16k", dense_16k, false, 8, 2},
    {"dense_causal_64k", dense_64k, true, 8, 2},
    {"shards_q128-1k_kv32k-128k", shards, true, 32, 8},
    {"shared_kv_head+tail_128k+32k", head_tail, true, 8, 2},
    {"ragged_pretrain_64k", ragged_64k, true, 16, 4},
};

class LargeAttention : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(LargeAttention, MatchesFp32Reference) {
  const auto started = std::chrono::steady_clock::now();
  const LargeCase& c = kCases[std::get<0>(GetParam())];
  const Heads h{c.hq, c.hkv, std::get<1>(GetParam())};
  const Batch b = c.make();
  if (c.make == ragged_64k) {
    ASSERT_GE(b.segments.size(), 30u) << "the ragged buffer should hold 30+ documents";
  }
  Stream stream;
  ASSERT_TRUE(stream.ok()) << "cudaStreamCreateWithFlags failed: no usable GPU?";

  const int64_t nq = b.tq * h.hq * h.d, nk = b.tk * h.hkv * h.d, nl = b.tq * h.hq;
  const int64_t counts[9] = {nq, nk, nk, nq, nq, nq, nk, nk, nl};  // q k v o dO dQ dK dV LSE
  std::vector<std::unique_ptr<DeviceBuffer>> bf16, f32;  // the backend's tensors (LSE fp32), the oracle's (fp32)
  for (int i = 0; i < 9; ++i) {
    const size_t n = static_cast<size_t>(counts[i]);
    bf16.push_back(device_buffer(n * (i == 8 ? 4 : 2)));
    f32.push_back(device_buffer(n * 4));
    ASSERT_TRUE(bf16.back()->get() && f32.back()->get()) << "cudaMalloc of " << n << " elements failed";
  }
  const auto data = [](const std::vector<std::unique_ptr<DeviceBuffer>>& t) {
    return AttentionData{t[0]->get(), t[1]->get(), t[2]->get(), t[3]->get(), t[4]->get(),
                         t[5]->get(), t[6]->get(), t[7]->get(), static_cast<float*>(t[8]->get())};
  };
  const AttentionData backend = data(bf16), oracle = data(f32);
  const int outputs[5] = {3, 5, 6, 7, 8};

  // Inputs: bf16 on the device, their exact fp32 copies for the oracle. Q spans [-2, 2) so that softmax
  // rows are not nearly uniform over tens of thousands of keys; K, V, dO span [-1, 1).
  const int inputs[4] = {0, 1, 2, 4};
  for (int i : inputs) {
    const uint64_t seed = 1000003ull * static_cast<uint64_t>(std::get<0>(GetParam()) + 1) + 97ull * h.d + i;
    CAD_CHECK_CUDA(fill_random_bf16(static_cast<uint16_t*>(bf16[i]->get()), counts[i], seed, i == 0 ? 2.f : 1.f, stream.get()));
    CAD_CHECK_CUDA(bf16_to_f32(static_cast<uint16_t*>(bf16[i]->get()), static_cast<float*>(f32[i]->get()), counts[i], stream.get()));
  }

  // The oracle (its outputs pre-filled with NaN too, so that a row it missed shows).
  for (int i : outputs) CAD_CHECK_CUDA(cudaMemsetAsync(f32[i]->get(), 0xff, f32[i]->bytes(), stream.get()));
  const auto oracle_start = std::chrono::steady_clock::now();
  CAD_CHECK_CUDA(run_reference(b, h, c.causal, oracle, stream.get()));
  const double oracle_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - oracle_start).count();
  // Oracle FLOPs: forward 4 d per score entry, dQ 6 d, dK/dV 8 d (it recomputes P and dP in both).
  const double oracle_flops = attended_pairs(b, c.causal) * h.hq * h.d * 18.0;

  std::vector<uint8_t> covered, read;
  row_masks(b, &covered, &read);
  const auto covered_d = device_buffer(covered.size()), read_d = device_buffer(read.size());
  ASSERT_TRUE(covered_d->get() && read_d->get());
  CAD_CHECK_CUDA(cudaMemcpy(covered_d->get(), covered.data(), covered.size(), cudaMemcpyHostToDevice));
  CAD_CHECK_CUDA(cudaMemcpy(read_d->get(), read.data(), read.size(), cudaMemcpyHostToDevice));
  int64_t longest = 0;
  for (const cad_segment_v1_t& s : b.segments) longest = std::max(longest, s.kv_len);

  // The backend with its default kernels (wgmma on Hopper) and with the portable mma.sync kernels (what
  // A100-class GPUs run), against the one oracle result; outputs pre-filled with NaN before each.
  const std::pair<const char*, const char*> kernel_sets[] = {{"default", "{}"}, {"portable", R"({"hopper_kernels": false})"}};
  for (const auto& [label, config] : kernel_sets) {
    SCOPED_TRACE(std::string("kernels: ") + label);
    AttentionPlugin gpu(plugin_path("cuda"), config);
    ASSERT_EQ(gpu.error(), "");
    for (int i : outputs) CAD_CHECK_CUDA(cudaMemsetAsync(bf16[i]->get(), 0xff, bf16[i]->bytes(), stream.get()));
    CAD_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
    double forward_ms = 0, backward_ms = 0;
    ASSERT_EQ(run_attention(gpu, b.segments, shape(b, h), c.causal, CAD_DEVICE_CUDA, kBf16, backend, stream.get(),
                            &forward_ms, &backward_ms),
              "");
    EXPECT_EQ(gpu.outstanding_device_bytes(), 0) << "workspace not handed back";
    Errors e;
    CAD_CHECK_CUDA(compare(b, h, backend, true, oracle, static_cast<const uint8_t*>(covered_d->get()),
                           static_cast<const uint8_t*>(read_d->get()), stream.get(), &e));
    std::printf("[large %s d=%d hq=%d hkv=%d kernels=%s] tq=%lld tk=%lld segs=%zu longest_kv=%lld  %s  bad %lld/%lld/%lld  "
                "cuda fwd %.1f ms bwd %.1f ms  oracle %.2f s (%.1f TFLOP/s)  case %.1f s\n",
                c.name, h.d, h.hq, h.hkv, label, static_cast<long long>(b.tq), static_cast<long long>(b.tk),
                b.segments.size(), static_cast<long long>(longest), format_errors(e).c_str(),
                static_cast<long long>(e.o.non_finite + e.lse.non_finite + e.dq.non_finite + e.dk.non_finite + e.dv.non_finite),
                static_cast<long long>(e.o.wrong_exact + e.lse.wrong_exact + e.dq.wrong_exact + e.dk.wrong_exact +
                                       e.dv.wrong_exact),
                static_cast<long long>(e.o.reference_bad + e.lse.reference_bad + e.dq.reference_bad + e.dk.reference_bad +
                                       e.dv.reference_bad),
                forward_ms, backward_ms, oracle_s, oracle_flops / oracle_s * 1e-12,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    std::fflush(stdout);
    expect_within(e, 1e-2, 1e-3);  // the limits of attention_gpu_test.cpp
  }
}

std::string large_case_name(const ::testing::TestParamInfo<LargeAttention::ParamType>& info) {
  std::string name = kCases[std::get<0>(info.param)].name;
  std::replace_if(name.begin(), name.end(), [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
  return name + "_d" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Gpu, LargeAttention,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCases))),
                                            ::testing::Values(64, 128)),
                         large_case_name);

}  // namespace
}  // namespace cad::gpu_test
