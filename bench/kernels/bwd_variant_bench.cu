// bwd_variant_bench.cu -- the backward's cases for an A/B of the Hopper backward's compile-time step
// schedules (CAD_BWD90_VARIANT, sm90/bwd_traits.cuh): one binary per build, run in turn by
// bench/kernels/bwd_variants.sh. Times, at Hq 32 / Hkv 8, bf16, causal, head dims 128 and 64: the Pretrain
// buffers 64K and 128K (buffer 0 of bench/kernels/pretrain_batches.txt), dense 16K and 64K, and dense 64K
// with a causal window of 4096 keys. One CSV line per case: forward and backward ms and TFLOP/s (backward
// counted as 2.5x the forward's FLOPs, the window's pairs only), through case_timer.h.
//   usage: cad_bwd_variant_bench PRETRAIN_BATCHES_TXT [HEAD_DIMS, default "128,64"] [REPS, default 3]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "case_timer.h"

namespace {

struct Case {
  std::string name;
  cad::bench::TimedCase timed;
};

Case documents(const std::string& name, const std::vector<int64_t>& lengths, int window_left = -1) {
  Case c{name, {}};
  for (int64_t len : lengths) {
    c.timed.segments.push_back({c.timed.tq, len, c.timed.tk, len});
    c.timed.tq += len;
    c.timed.tk += len;
  }
  c.timed.window_left = window_left;
  return c;
}

std::vector<Case> cases(const char* pretrain_file) {
  std::vector<Case> out;
  std::ifstream in(pretrain_file);
  if (!in) throw std::runtime_error(std::string("cannot read ") + pretrain_file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    if (name != "pretrain_64k_buf0" && name != "pretrain_128k_buf0") continue;
    std::vector<int64_t> docs;
    for (int64_t len; words >> len;) docs.push_back(len);
    out.push_back(documents(name, docs));
  }
  if (out.size() != 2) throw std::runtime_error(std::string(pretrain_file) + ": pretrain_{64k,128k}_buf0 missing");
  out.push_back(documents("dense_causal_16k", {16384}));
  out.push_back(documents("dense_causal_64k", {65536}));
  out.push_back(documents("dense_64k_window4096", {65536}, 4096));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cad_bwd_variant_bench PRETRAIN_BATCHES_TXT [HEAD_DIMS] [REPS]\n");
    return 2;
  }
  const std::string dims = argc > 2 ? argv[2] : "128,64";
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  try {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) throw std::runtime_error("no CUDA device");
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      throw std::runtime_error("cudaStreamCreateWithFlags failed");
    }
    std::printf("case,d,fwd_ms,bwd_ms,fwd_tflops,bwd_tflops\n");
    const std::vector<Case> all = cases(argv[1]);
    std::istringstream list(dims);
    for (std::string d; std::getline(list, d, ',');) {
      for (Case c : all) {
        c.timed.head_dim = std::stoi(d);
        cad::bench::TimingOptions o;
        o.warmups = 1;
        o.reps = reps;
        const cad::bench::CaseTiming r = cad::bench::time_case(c.timed, o, prop.multiProcessorCount, stream);
        const double fl = cad::bench::forward_flops(c.timed);
        std::printf("%s,%d,%.4f,%.4f,%.1f,%.1f\n", c.name.c_str(), c.timed.head_dim, r.fwd_ms, r.bwd_ms,
                    fl / r.fwd_ms / 1e9, 2.5 * fl / r.bwd_ms / 1e9);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad_bwd_variant_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
