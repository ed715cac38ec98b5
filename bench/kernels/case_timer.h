// case_timer.h -- times one attention case with the project's kernels (kernels/cad_kernels.h): a segment
// table, the batch's row counts and the heads -> forward and backward milliseconds. Shared by the
// cad_kernel_bench CLI (kernel_bench.cu) and the timing library that diet_bench.py loads
// (case_timer_capi.cu), so that both time a case the same way:
//   inputs random bf16 in [-1, 1); CUDA events around each call on one stream; `warmups` calls first,
//   then the median of `reps` calls; the backward reads the default forward's O/LSE.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "cad_kernels.h"

namespace cad::bench {

struct TimedCase {
  std::vector<cad::kernels::Segment> segments;
  int64_t tq = 0, tk = 0;
  bool causal = true;
  int hq = 32, hkv = 8, head_dim = 128;
  int window_left = -1;  // sliding window (AttentionProblem::window_left); -1: none
};

struct TimingOptions {
  int warmups = 2;
  int reps = 10;
  bool backward = true;
  bool split_kv = true;   // false: plan the forward as if the GPU had one SM (no KV splitting)
  bool portable = false;  // also time the portable mma.sync kernels (forward, and backward when timed)
};

struct CaseTiming {
  double fwd_ms = 0, bwd_ms = 0;                    // the default kernels (wgmma on Hopper)
  double portable_fwd_ms = 0, portable_bwd_ms = 0;  // 0 unless TimingOptions::portable
  size_t fwd_items = 0, fwd_combines = 0;
  bool bwd_kv_exclusive = false;
};

// Forward FLOPs: per segment and query head, causal 4*d*(q*kv - q*(q-1)/2), non-causal 4*d*q*kv, a causal
// window 4*d per (query, key) pair it keeps. The
// backward counts 2.5x.
double forward_flops(const TimedCase& c);

// The case needs more device memory (tensors and the largest plan workspace) than is free; nothing ran.
struct NotEnoughMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Times the case on `stream` (the current device). Throws std::invalid_argument for a malformed case
// (segments outside the batch, heads, head dim), NotEnoughMemory before allocating what does not fit, and
// std::runtime_error naming any other failure (cudaMalloc, a launch); frees its device memory on every path.
CaseTiming time_case(const TimedCase& c, const TimingOptions& options, int num_sms, cudaStream_t stream);

}  // namespace cad::bench
