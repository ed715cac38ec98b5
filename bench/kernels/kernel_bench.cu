// kernel_bench.cu -- times the project's attention kernels (kernels/cad_kernels.h) on the benchmark's
// cases and prints one CSV line per case: case,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops,... The timing of one
// case (FLOPs, inputs, warm-ups, median) is case_timer.h's, shared with diet_bench.py's library: 2
// warm-ups, median of 5 (cases above 5e13 FLOPs) or 10 repeats.
// Usage: cad_kernel_bench [pretrain_batches.txt] [filter-substring]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cad_kernels.h"
#include "case_timer.h"

namespace {

using cad::kernels::Segment;

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

void run_case(const Case& c, int hq, int hkv, int d, int num_sms, cudaStream_t stream) {
  cad::bench::TimedCase t;
  t.segments = c.segments;
  t.tq = c.tq;
  t.tk = c.tk;
  t.causal = c.causal;
  t.hq = hq;
  t.hkv = hkv;
  t.head_dim = d;
  const double total = cad::bench::forward_flops(t);
  cad::bench::TimingOptions o;
  o.warmups = 2;
  o.reps = total > 5e13 ? 5 : 10;
  o.split_kv = c.split_kv;
  // CAD_BENCH_FORWARD_ONLY=1: only the default forward (for quick kernel A/B runs).
  const bool forward_only = std::getenv("CAD_BENCH_FORWARD_ONLY") != nullptr;
  o.backward = c.backward && !forward_only;
  o.portable = !forward_only;  // the portable (mma.sync) kernels too, for comparison with the default
  const cad::bench::CaseTiming r = cad::bench::time_case(t, o, num_sms, stream);
  std::printf("%s,%.4f,%.4f,%.1f,%.1f,%.1f,%.1f,%zu,%zu,%d\n", c.name.c_str(), r.fwd_ms, r.bwd_ms,
              total / r.fwd_ms / 1e9, r.bwd_ms > 0 ? 2.5 * total / r.bwd_ms / 1e9 : 0.0,
              r.portable_fwd_ms > 0 ? total / r.portable_fwd_ms / 1e9 : 0.0,
              r.portable_bwd_ms > 0 ? 2.5 * total / r.portable_bwd_ms / 1e9 : 0.0, r.fwd_items, r.fwd_combines,
              r.bwd_kv_exclusive ? 1 : 0);
  std::fflush(stdout);
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
  try {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) throw std::runtime_error("no CUDA device");
    std::fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      throw std::runtime_error("cudaStreamCreateWithFlags failed");
    }
    std::printf("case,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops,fwd_portable_tflops,bwd_portable_tflops,fwd_items,"
                "fwd_split_tiles,bwd_kv_exclusive\n");
    std::fprintf(stderr, "forward kernel: %s\n",
                 cad::kernels::hopper_kernels_available() ? "wgmma (sm_90a)" : "mma.sync");
    for (const Case& c : all_cases(pretrain)) {
      if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
      run_case(c, 32, 8, 128, prop.multiProcessorCount, stream);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad_kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
