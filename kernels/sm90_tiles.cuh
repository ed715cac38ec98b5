// sm90_tiles.cuh -- shared-memory tiles in the layout Hopper's wgmma reads (128-byte swizzle), filled
// with cp.async; used by the sm_90a forward and backward kernels.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "mma_utils.cuh"

// Kernel bodies that use sm_90a instructions compile only in the sm_90a pass; elsewhere they are stubs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CAD_SM90_KERNEL_BODY 1
#endif

namespace cad::kernels::detail {

// Element offset of (row, col) in a tile of ROWS rows stored as D/64 atoms of [ROWS][64], each
// 128-byte row's 16-byte chunks XOR-swizzled by row % 8 (wgmma's SW128 layout; atoms 1024-aligned).
template <int ROWS>
__device__ __forceinline__ int atom_swizzled(int row, int col) {
  return (col >> 6) * (ROWS * 64) + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3) + (col & 7);
}

template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile_atoms_async(__nv_bfloat16* smem, const __nv_bfloat16* src, int64_t stride,
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
    cp_async_16(smem + atom_swizzled<ROWS>(row, col), valid ? src + row * stride + col : src, valid);
  }
}

}  // namespace cad::kernels::detail
