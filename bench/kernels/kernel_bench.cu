// kernel_bench.cu -- times the project's attention kernels (kernels/cad_kernels.h) on the benchmark's
// cases and prints one CSV line per case: case,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops.
// FLOPs per segment and head: causal forward 4*d*(q*kv - q*(q-1)/2), non-causal 4*d*q*kv, backward
// 2.5x forward. Timing: CUDA events around each call, 2 warm-ups, median of the repeats; inputs are
// random bf16 in [-1, 1). Usage: cad_kernel_bench [pretrain_batches.txt] [filter-substring]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cad_kernels.h"

namespace {

using cad::kernels::Segment;

#define CHECK(expr)                                                                                  \
  do {                                                                                               \
    const cudaError_t e_ = (expr);                                                                   \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));    \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)

struct Case {
  std::string name;
  std::vector<Segment> segments;
  int64_t tq = 0, tk = 0;
  bool causal = true;
  bool split_kv = true;   // false: plan as if the GPU had one SM (no KV splitting), forward only
  bool backward = true;
};

// Segments whose queries are the last q tokens of a causal KV prefix of kv tokens, each with its own KV.
Case shards(const std::string& name, const std::vector<std::pair<int64_t, int64_t>>& q_kv) {
  Case c;
  c.name = name;
  for (auto [q, kv] : q_kv) {
    c.segments.push_back({c.tq, q, c.tk, kv});
    c.tq += q;
    c.tk += kv;
  }
  return c;
}

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = __float2bfloat16(static_cast<float>(x) / 4294967296.f * 2.f - 1.f);
  }
}

double flops_forward(const Case& c, int hq, int d) {
  double total = 0;
  for (const Segment& s : c.segments) {
    const double q = static_cast<double>(s.q_len), kv = static_cast<double>(s.kv_len);
    total += c.causal ? 4.0 * d * (q * kv - q * (q - 1) / 2) : 4.0 * d * q * kv;
  }
  return total * hq;
}

template <class F>
double median_ms(F&& run, int reps, cudaStream_t stream) {
  for (int i = 0; i < 2; ++i) run();
  CHECK(cudaStreamSynchronize(stream));
  std::vector<float> times;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a, stream));
    run();
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    times.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void run_case(const Case& c, int hq, int hkv, int d, int num_sms, cudaStream_t stream) {
  cad::kernels::AttentionProblem pr;
  pr.tq = c.tq;
  pr.tk = c.tk;
  pr.hq = hq;
  pr.hkv = hkv;
  pr.head_dim = d;
  pr.softmax_scale = 1.f / std::sqrt(static_cast<float>(d));
  pr.causal = c.causal;
  const size_t nq = size_t(c.tq) * hq * d, nk = size_t(c.tk) * hkv * d;
  __nv_bfloat16 *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
  float* lse;
  CHECK(cudaMalloc(&q, nq * 2));
  CHECK(cudaMalloc(&o, nq * 2));
  CHECK(cudaMalloc(&d_o, nq * 2));
  CHECK(cudaMalloc(&dq, nq * 2));
  CHECK(cudaMalloc(&k, nk * 2));
  CHECK(cudaMalloc(&v, nk * 2));
  CHECK(cudaMalloc(&dk, nk * 2));
  CHECK(cudaMalloc(&dv, nk * 2));
  CHECK(cudaMalloc(&lse, size_t(c.tq) * hq * 4));
  fill_random<<<1024, 256, 0, stream>>>(q, nq, 1);
  fill_random<<<1024, 256, 0, stream>>>(k, nk, 2);
  fill_random<<<1024, 256, 0, stream>>>(v, nk, 3);
  fill_random<<<1024, 256, 0, stream>>>(d_o, nq, 4);
  CHECK(cudaGetLastError());

  // The portable (mma.sync) forward too, for comparison with the default (wgmma on Hopper).
  cad::kernels::AttentionProblem portable = pr;
  portable.hopper = false;
  pr.hopper = cad::kernels::hopper_kernels_available();
  const auto fplan = cad::kernels::make_forward_plan(pr, c.segments.data(), int64_t(c.segments.size()),
                                                     c.split_kv ? num_sms : 1);
  const auto pplan = cad::kernels::make_forward_plan(portable, c.segments.data(), int64_t(c.segments.size()),
                                                     c.split_kv ? num_sms : 1);
  const auto bplan = cad::kernels::make_backward_plan(pr, c.segments.data(), int64_t(c.segments.size()));
  const auto pbplan = cad::kernels::make_backward_plan(portable, c.segments.data(), int64_t(c.segments.size()));
  void* ws = nullptr;
  CHECK(cudaMalloc(&ws, std::max<size_t>(
                            std::max(std::max(fplan.workspace_bytes, pplan.workspace_bytes), bplan.workspace_bytes), 256)));

  const double total = flops_forward(c, hq, d);
  const int reps = total > 5e13 ? 5 : 10;
  const double fwd_ms = median_ms([&] { CHECK(cad::kernels::attention_forward(fplan, q, k, v, o, lse, ws, stream)); },
                                  reps, stream);
  // CAD_BENCH_FORWARD_ONLY=1: only the default forward (for quick kernel A/B runs).
  const bool forward_only = std::getenv("CAD_BENCH_FORWARD_ONLY") != nullptr;
  const double portable_ms = forward_only ? 0.0 : median_ms(
      [&] { CHECK(cad::kernels::attention_forward(pplan, q, k, v, o, lse, ws, stream)); }, reps, stream);
  // The backward below reads the default forward's O/LSE.
  CHECK(cad::kernels::attention_forward(fplan, q, k, v, o, lse, ws, stream));
  double bwd_ms = 0, portable_bwd_ms = 0;
  if (c.backward && !forward_only) {
    bwd_ms = median_ms(
        [&] { CHECK(cad::kernels::attention_backward(bplan, q, k, v, o, lse, d_o, dq, dk, dv, ws, stream)); }, reps,
        stream);
    portable_bwd_ms = median_ms(
        [&] { CHECK(cad::kernels::attention_backward(pbplan, q, k, v, o, lse, d_o, dq, dk, dv, ws, stream)); }, reps,
        stream);
  }
  CHECK(cudaStreamSynchronize(stream));
  std::printf("%s,%.4f,%.4f,%.1f,%.1f,%.1f,%.1f,%zu,%zu,%d\n", c.name.c_str(), fwd_ms, bwd_ms, total / fwd_ms / 1e9,
              bwd_ms > 0 ? 2.5 * total / bwd_ms / 1e9 : 0.0, portable_ms > 0 ? total / portable_ms / 1e9 : 0.0,
              portable_bwd_ms > 0 ? 2.5 * total / portable_bwd_ms / 1e9 : 0.0, fplan.items.size(),
              fplan.combines.size(), bplan.kv_exclusive ? 1 : 0);
  std::fflush(stdout);
  for (void* p : {static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(d_o), static_cast<void*>(dq),
                  static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(dk), static_cast<void*>(dv),
                  static_cast<void*>(lse), ws}) {
    cudaFree(p);
  }
}

std::vector<Case> all_cases(const char* pretrain_file) {
  std::vector<Case> cases;
  // (a) dense causal, one sequence.
  for (int64_t n : {4096, 16384, 65536}) {
    cases.push_back(shards("dense_causal_" + std::to_string(n / 1024) + "k", {{n, n}}));
  }
  // (b) CAD shard batches: short query shards at the end of long causal KV prefixes.
  std::vector<std::pair<int64_t, int64_t>> q128;
  for (int i = 1; i <= 16; ++i) q128.push_back({128, 8192 * i});
  cases.push_back(shards("shards_q128_kv8k-128k", q128));
  Case nosplit = shards("shards_q128_kv8k-128k_nosplit", q128);
  nosplit.split_kv = false;
  nosplit.backward = false;
  cases.push_back(nosplit);
  // Too few query tiles to fill the GPU (2 shards x 32 heads < 132 SMs): only the KV split helps here.
  cases.push_back(shards("shards_2x_q128_kv128k", {{128, 131072}, {128, 131072}}));
  cases.push_back(shards("shards_q1k_kv32k-128k", {{1024, 32768}, {1024, 65536}, {1024, 98304}, {1024, 131072},
                                                  {1024, 49152}, {1024, 81920}, {1024, 114688}, {1024, 16384}}));
  cases.push_back(shards("shards_mixed_q128-8k_kv16k-128k",
                         {{128, 131072}, {256, 98304}, {512, 65536}, {1024, 32768}, {2048, 131072}, {4096, 49152},
                          {8192, 16384}, {128, 24576}, {512, 81920}, {2048, 114688}}));
  // CAD head/tail pairs: two shards of one 128K document share its KV prefix.
  {
    Case c;
    c.name = "shards_shared_kv_4x128k_head+tail_2k";
    for (int doc = 0; doc < 4; ++doc) {
      const int64_t len = 131072, kv0 = c.tk;
      c.segments.push_back({c.tq, 2048, kv0, 2048});  // head: queries [0, 2K) see keys [0, 2K)
      c.tq += 2048;
      c.segments.push_back({c.tq, 2048, kv0, len});   // tail: queries [126K, 128K) see keys [0, 128K)
      c.tq += 2048;
      c.tk += len;
    }
    cases.push_back(c);
  }
  // (c) Pretrain-recipe buffers: every document (piece) one causal segment.
  if (pretrain_file != nullptr) {
    std::ifstream in(pretrain_file);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string name;
      words >> name;
      std::vector<std::pair<int64_t, int64_t>> docs;
      int64_t len;
      while (words >> len) docs.push_back({len, len});
      if (!docs.empty()) cases.push_back(shards(name, docs));
    }
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  const char* pretrain = argc > 1 ? argv[1] : nullptr;
  const std::string filter = argc > 2 ? argv[2] : "";
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("case,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops,fwd_portable_tflops,bwd_portable_tflops,fwd_items,fwd_split_tiles,bwd_kv_exclusive\n");
  std::fprintf(stderr, "forward kernel: %s\n", cad::kernels::hopper_kernels_available() ? "wgmma (sm_90a)" : "mma.sync");
  for (const Case& c : all_cases(pretrain)) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    run_case(c, 32, 8, 128, prop.multiProcessorCount, stream);
  }
  return 0;
}
