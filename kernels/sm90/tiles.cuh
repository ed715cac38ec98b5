// sm90/tiles.cuh -- shared-memory tiles in the layout Hopper's wgmma reads (128-byte swizzle), filled
// with cp.async through the common chunk loop (common/tile_load.cuh); TMA writes the same layout
// (sm90/async.cuh). Used by the sm_90a backward; the sm_90a forward loads with TMA only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/tile_load.cuh"
#include "sm90/arch.cuh"

namespace cad::kernels::detail {

// Element offset of (row, col) in a tile of ROWS rows stored as D/64 atoms of [ROWS][64], each
// 128-byte row's 16-byte chunks XOR-swizzled by row % 8 (wgmma's SW128 layout; atoms 1024-aligned).
template <int ROWS>
__device__ __forceinline__ int atom_swizzled(int row, int col) {
  return (col >> 6) * (ROWS * 64) + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3) + (col & 7);
}
template <int ROWS>
struct AtomSwizzle {
  __device__ __forceinline__ static int offset(int row, int col) { return atom_swizzled<ROWS>(row, col); }
};

// Four 8x8 bf16 matrices to shared memory in one instruction (stmatrix, sm_90): register m of every lane is its
// two elements of matrix m in the mma accumulator layout (row lane / 4, columns 2 (lane % 4), +1), and lane l gives
// the address of row l % 8 of matrix l / 8 (16-byte aligned). One instruction where four 4-byte stores and their
// addresses were.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_row_addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row_addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile_atoms_async(__nv_bfloat16* smem, const __nv_bfloat16* src, int64_t stride,
                                                      int valid_rows, int tid) {
  load_tile_chunks_async<ROWS, COLS, THREADS, AtomSwizzle<ROWS>>(smem, src, stride, valid_rows, tid);
}

}  // namespace cad::kernels::detail
