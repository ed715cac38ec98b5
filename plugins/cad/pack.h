// pack.h -- CAD's data movement kernels (CUDA builds only; pack.cu): many row-range copies in one launch (pack =
// gather rows into a send buffer, unpack = scatter them back), LSE moved as rows, and the fixed-order sums of
// partial dK/dV that several servers send back for the same rows. Not attention kernels: they move the rows of
// CAD's exchanges (mover.h), so they live beside the plugin; the benchmarks and tests/gpu reach them here.
// Plain functions over raw device pointers that enqueue on `stream` only and return the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cad::kernels {

// Copies `num_rows` rows of `row_bytes` bytes each from src row `src_row` to dst row `dst_row`.
struct RowCopy {
  int64_t src_row;
  int64_t dst_row;
  int64_t num_rows;
};

// Many row-range copies in one launch (CAD's pack = gather into a send buffer, unpack = scatter back).
// `copies` points to `num_copies` entries in DEVICE memory. Ranges must not overlap in dst.
cudaError_t copy_row_ranges(const void* src, void* dst, int64_t row_bytes, const RowCopy* copies, int64_t num_copies,
                            cudaStream_t stream);

// The same where a copied row is a `row_bytes` slice of rows that lie `src_row_stride` / `dst_row_stride` bytes
// apart (strides >= row_bytes; src and dst point at the slice in row 0): CAD's head groups move some heads of
// every [T, H, D] row. copy_row_ranges is the case of both strides equal to row_bytes.
cudaError_t copy_row_slices(const void* src, int64_t src_row_stride, void* dst, int64_t dst_row_stride,
                            int64_t row_bytes, const RowCopy* copies, int64_t num_copies, cudaStream_t stream);

// out[i] = (accumulate ? out[i] : 0) + partials[0][i] + partials[1][i] + ... in fp32, in that fixed
// order (deterministic), for i < numel; partial p starts at partials + p * partial_stride (elements).
cudaError_t sum_partials_bf16(const void* partials, int num_partials, int64_t partial_stride, int64_t numel,
                              void* out, bool accumulate, cudaStream_t stream);
cudaError_t sum_partials_f32(const float* partials, int num_partials, int64_t partial_stride, int64_t numel,
                             float* out, bool accumulate, cudaStream_t stream);

// Per-head fp32 rows with arbitrary strides (CAD moves LSE [H, T] as wire rows [T, H]): for every copy,
// dst[(dst_row + i) * dst_row_stride + h * dst_head_stride] = src[(src_row + i) * src_row_stride +
// h * src_head_stride] for i < num_rows, h < heads. Strides in elements; `copies` in DEVICE memory.
cudaError_t copy_strided_rows_f32(const float* src, int64_t src_row_stride, int64_t src_head_stride, float* dst,
                                  int64_t dst_row_stride, int64_t dst_head_stride, int64_t heads,
                                  const RowCopy* copies, int64_t num_copies, cudaStream_t stream);

// For i < num_rows: out row owner_rows[i] = the fp32 sum, in index order, of the rows src_rows[j] of `src`
// for j in [first[i], first[i+1]); stored as bf16 or fp32 (`bf16`, src and out alike). CAD's owners sum the
// partial dK/dV of every server that read a key/value row this way: one pass, a fixed order (bitwise
// reproducible), no accumulator in memory. The three index arrays are in DEVICE memory. `accumulate`: the sum
// starts from the out row's value (an owner's own partial sums) instead of 0. `out_row_stride`: elements
// between out rows where a row's `row_elems` are a slice of a longer row (a head group's); 0: row_elems.
cudaError_t sum_rows(const void* src, bool bf16, int64_t row_elems, const int64_t* first, const int64_t* src_rows,
                     const int64_t* owner_rows, int64_t num_rows, void* out, cudaStream_t stream,
                     bool accumulate = false, int64_t out_row_stride = 0);

}  // namespace cad::kernels
