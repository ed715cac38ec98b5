// device_checks.h -- inputs and comparisons computed on the GPU, for tests whose tensors are too large to
// generate or compare on the host in reasonable time (hundreds of millions of elements).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cad::gpu_test {

// n bf16 values (raw bits), uniform in [-amplitude, amplitude] (after rounding to bf16), from a hash of
// (seed, index): the same seed gives the same tensor on every run and GPU.
cudaError_t fill_random_bf16(uint16_t* out, int64_t n, uint64_t seed, float amplitude, cudaStream_t stream);
// out[i] = in[i] as fp32 (exact).
cudaError_t bf16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);

// A tensor compared with its reference. "Defined" rows are those some segment covers (O, LSE, dQ) or
// reads (dK, dV); the others must be exactly 0 (LSE: -inf) in both.
struct TensorCheck {
  double max_error = 0;      // max |got - ref| over defined entries (LSE: / max(1, |ref|))
  double max_reference = 0;  // max |ref| over defined entries (LSE: unused)
  int64_t non_finite = 0;    // defined entries where got is NaN/inf but ref is finite
  int64_t wrong_exact = 0;   // entries that must be exactly 0 / -inf in got (undefined rows; LSE rows with no key) and are not
  int64_t reference_bad = 0; // the reference itself: non-finite in a defined row (LSE: NaN/+inf), or not 0 / -inf in an undefined one
  // The measure of the GPU tests: max abs error / max abs reference (0 / 0 = 0). For LSE read max_error.
  double relative() const;
  bool structurally_clean() const { return non_finite == 0 && wrong_exact == 0 && reference_bad == 0; }
};

// got: bf16 bits (got_bf16) or fp32 (got_f32, exactly one non-null), ref: fp32, both [rows, row_elems];
// row_defined: `rows` bytes in DEVICE memory, non-zero = defined. Synchronises the stream.
cudaError_t check_rows(const uint16_t* got_bf16, const float* got_f32, const float* ref, int64_t rows, int64_t row_elems,
                       const uint8_t* row_defined, cudaStream_t stream, TensorCheck* result);
// LSE [heads, rows] fp32 (got and ref); a defined row whose ref is -inf (no key visible) must be -inf in got.
cudaError_t check_lse(const float* got, const float* ref, int64_t heads, int64_t rows, const uint8_t* row_defined,
                      cudaStream_t stream, TensorCheck* result);

}  // namespace cad::gpu_test
