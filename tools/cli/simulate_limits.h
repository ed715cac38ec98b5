// simulate_limits.h -- what `cad simulate` accepts, checked before any work: each bound names the
// option and the range. Without them `--gpus 65536`, `--steps 1048576` or `--microbatches 1048576` ran
// for minutes with no output, `--tp 2^32 --pp 2^32` died of SIGFPE and `--gemm-tflops 1e-320` printed
// `"total_s": null`. The bounds are those of the model, not of today's machines.
#pragma once

#include <cstdint>

namespace cad::cli::simulate_limits {

// Data-parallel ranks plan together: the same bound as `cad plan --ranks` (the balancers' inputs and
// the link matrices the plan model keeps grow with its square).
constexpr int64_t kMaxDataParallel = 8192;
// GPUs in all: data-parallel ranks x tensor x pipeline parallel. 2^20 leaves room for tp x pp = 128.
constexpr int64_t kMaxGpus = int64_t{1} << 20;
// Tensor-parallel groups stay inside a node; pipeline stages divide the layers.
constexpr int64_t kMaxGpusPerNode = 1024;
constexpr int64_t kMaxTp = 1024;
constexpr int64_t kMaxPp = 1024;
// Tokens per rank: the document-length and context bound of `cad plan`.
constexpr int64_t kMaxContext = int64_t{1} << 40;
// Each step keeps one time per rank, micro-batch, balancer and mode until the step is priced:
// micro-batches x data-parallel ranks at most 2^20 (64 MiB for 4 balancers).
constexpr int64_t kMaxSteps = 10000;
constexpr int64_t kMaxMicrobatches = 4096;
constexpr int64_t kMaxMicrobatchRanks = int64_t{1} << 20;
// Rates (TFLOP/s, Gb/s): positive and normal, so that no time is infinite or a denormal quotient.
constexpr double kMinRate = 1e-3;
constexpr double kMaxRate = 1e6;

}  // namespace cad::cli::simulate_limits
