// mma_utils.cuh -- thin wrappers over the Ampere-and-later warp-level instructions the attention
// kernels are built from: cp.async (global -> shared, 16 bytes, zero-fill for rows outside the
// tensor), ldmatrix (shared -> mma fragments, plain and transposed), mma.sync m16n8k16 bf16 with
// fp32 accumulators, and the XOR swizzle that keeps ldmatrix free of bank conflicts.
//
// Fragment layouts of mma.m16n8k16 (lane = 4*g + t):
//   A (16x16, row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8, "col"):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8, fp32):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

namespace cad::kernels::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

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

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

// C += A * B for one m16n8k16 tile.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values -> one register of two bf16 (low half = first).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// A tile of ROWS x COLS bf16 in shared memory, rows of COLS elements, with the 16-byte chunks of
// each row XOR-swizzled by (row % 8): eight rows read at one column by ldmatrix hit eight different
// bank groups. COLS must be a multiple of 64.
template <int COLS>
__device__ __forceinline__ int swizzled(int row, int col) {
  static_assert(COLS % 64 == 0, "rows must hold a multiple of 8 chunks of 16 bytes");
  return row * COLS + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// Copies ROWS x COLS bf16 from global rows (row stride `stride` elements, first row `src`) into a
// swizzled shared tile with all threads of the block; rows >= valid_rows are zero-filled.
template <int ROWS, int COLS, int THREADS>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16* smem, const __nv_bfloat16* src, int64_t stride,
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
    const __nv_bfloat16* g = valid ? src + row * stride + col : src;
    cp_async_16(smem + swizzled<COLS>(row, col), g, valid);
  }
}

// 2^x through the SFU (ex2.approx: ~2 ulp, exp2(-inf) = +0), which the softmax needs by the billion.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// dst[0] += a, dst[1] += b (8-byte aligned): one vector atomic on Hopper, two scalar ones before it.
__device__ __forceinline__ void atomic_add_pair(float* dst, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(a, b));
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
#endif
}

__device__ __forceinline__ float warp_quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}
__device__ __forceinline__ float warp_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

}  // namespace cad::kernels::detail
