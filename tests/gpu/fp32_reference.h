// fp32_reference.h -- an fp32 attention oracle that runs on the GPU, for checking the cuda backend at
// benchmark scale (tens of thousands of tokens), where the CPU reference would take minutes.
//
// Same semantics as plugins/reference_attention/reference_math.h (and plugin_api/cad_attention_v1.h):
// layouts Q, O, dO, dQ [tq, hq, d]; K, V, dK, dV [tk, hkv, d]; LSE [hq, tq] (natural log of the
// scaled scores); query head h reads KV head h / (hq / hkv); segment query i sees the keys j < i + 1 +
// kv_len - q_len of its KV range when causal (bottom-right aligned), all kv_len otherwise. Rows of Q no
// segment covers get O = 0, LSE = -inf, dQ = 0; rows of K/V no segment reads get dK = dV = 0; dK/dV sum
// over every segment and query head that reads a row (segments may share K/V rows).
//
// Numerics: fp32 inputs, fp32 SIMT arithmetic only (no tensor cores, no TF32; built without fast
// math). Forward: online softmax over 64-key tiles. Backward: D_i = rowsum(dO_i * O_i); P recomputed
// from the given LSE; dQ by one block per (64-query tile, query head), dK/dV by one block per (64-key
// tile, KV head) walking every segment and query head that reads the tile, in a fixed order. No
// atomics: results are deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cad_common_v1.h"

namespace cad::gpu_test {

struct ReferenceBatch {
  int64_t tq = 0;
  int64_t tk = 0;
  int hq = 0;
  int hkv = 0;
  int head_dim = 0;  // 64 or 128
  float softmax_scale = 0.f;
  bool causal = false;
  const cad_segment_v1_t* segments = nullptr;  // HOST memory; in bounds, disjoint in Q, q_len <= kv_len if causal
  int64_t num_segments = 0;
};

// All tensor pointers are DEVICE memory, fp32, compact. Both calls enqueue on `stream`, then
// synchronise it (they free their own work tables) and return the first CUDA error, or
// cudaErrorInvalidValue for a batch outside the rules above.
cudaError_t reference_forward(const ReferenceBatch& batch, const float* q, const float* k, const float* v, float* o,
                              float* lse, cudaStream_t stream);

cudaError_t reference_backward(const ReferenceBatch& batch, const float* q, const float* k, const float* v,
                               const float* o, const float* lse, const float* d_o, float* d_q, float* d_k,
                               float* d_v, cudaStream_t stream);

}  // namespace cad::gpu_test
