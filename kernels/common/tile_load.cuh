// common/tile_load.cuh -- global -> shared tile loads with cp.async (sm_80 and later), shared by every
// kernel that does not load with TMA: the sm80 forward and backward, and the sm90 backward's K/V and Q/dO
// tiles. One chunk loop (load_tile_chunks_async) serves both shared-memory layouts; a layout is a type
// with `static int offset(row, col)` (in elements):
//  - RowSwizzle<COLS> (here): rows of COLS elements, 16-byte chunks XOR-swizzled by row % 8 -- what
//    ldmatrix reads without bank conflicts (load_tile_async);
//  - AtomSwizzle<ROWS> (sm90/tiles.cuh): wgmma's 128-byte-swizzled atoms (load_tile_atoms_async).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/mma_utils.cuh"

namespace cad::kernels::detail {

// ---- cp.async ----------------------------------------------------------------------------------------
// 16-byte async copy; when `valid` is false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem_dst)), "l"(gmem_src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- the chunk loop ------------------------------------------------------------------------------------
// Copies ROWS x COLS bf16 from global rows (row stride `stride` elements, first row `src`) into a shared
// tile laid out by Layout, with all THREADS threads of the block; rows >= valid_rows are zero-filled.
template <int ROWS, int COLS, int THREADS, typename Layout>
__device__ __forceinline__ void load_tile_chunks_async(__nv_bfloat16* smem, const __nv_bfloat16* src, int64_t stride,
                                                       int valid_rows, int tid) {
  constexpr int kChunksPerRow = COLS / 8;
  constexpr int kChunks = ROWS * kChunksPerRow;
  static_assert(kChunks % THREADS == 0, "tile must split evenly over the block");
#pragma unroll
  for (int i = 0; i < kChunks / THREADS; ++i) {
    const int chunk = tid + i * THREADS;
    const int row = chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    const bool valid = row < valid_rows;
    cp_async_16(smem + Layout::offset(row, col), valid ? src + row * stride + col : src, valid);
  }
}

// ---- the ldmatrix layout -------------------------------------------------------------------------------
// A tile of ROWS x COLS bf16 in shared memory, rows of COLS elements, with the 16-byte chunks of
// each row XOR-swizzled by (row % 8): eight rows read at one column by ldmatrix hit eight different
// bank groups. COLS must be a multiple of 64.
template <int COLS>
__device__ __forceinline__ int swizzled(int row, int col) {
  static_assert(COLS % 64 == 0, "rows must hold a multiple of 8 chunks of 16 bytes");
  return row * COLS + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}
template <int COLS>
struct RowSwizzle {
  __device__ __forceinline__ static int offset(int row, int col) { return swizzled<COLS>(row, col); }
};

template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16* smem, const __nv_bfloat16* src, int64_t stride,
                                                int valid_rows, int tid) {
  load_tile_chunks_async<ROWS, COLS, THREADS, RowSwizzle<COLS>>(smem, src, stride, valid_rows, tid);
}

}  // namespace cad::kernels::detail
