// sm90/async.cuh -- the async primitives of the Hopper (sm_90a) kernels, all in one place, as inline PTX:
// mbarriers (transaction-counted stage barriers), TMA tile loads (cp.async.bulk.tensor), TMA reductions
// and bulk-group waits (cp.reduce.async.bulk), the generic -> async proxy fence, named barriers and
// register reallocation (setmaxnreg). Device functions are only called from sm_90a kernel bodies; the
// host helper declared at the end (sm90/tma_descriptor.cpp) encodes the TMA descriptors. The wgmma
// instructions and their fences are sm90/wgmma.cuh; the sm_80 cp.async copies are common/tile_load.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <cstdint>

namespace cad::kernels::detail {

// ---- mbarriers ---------------------------------------------------------------------------------------
// A 64-bit barrier in shared memory with an arrival count and a transaction (byte) count. A phase
// completes when `count` threads have arrived and every byte announced with expect_tx has landed; its
// parity (0, 1, 0, ...) is what waiters test.

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes initialised barriers visible to the async proxy (TMA) before anyone uses them.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Arrives once and announces `bytes` of TMA traffic that must land before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
#ifdef __CUDACC__  // __syncwarp is nvcc's (sm90/tma_descriptor.cpp, plain C++, includes this file for its host part)
// Arrives once for the whole warp, after every lane of it is here (done with what the barrier guards): for
// barriers that count warps.
__device__ __forceinline__ void mbar_arrive_warp(uint32_t bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}
#endif
// Blocks until the phase with the given parity has completed. Waiting for parity 1 on a fresh barrier
// returns at once (the phase "before" the first one counts as complete): producers rely on that to
// find every stage empty at the start.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// ---- TMA -----------------------------------------------------------------------------------------------
// Loads one box of a 3-D tensor map (coordinates innermost first, in elements) into shared memory and
// counts its bytes on `bar`. Out-of-bounds elements are filled with zeros.
__device__ __forceinline__ void tma_load_3d(uint32_t smem_dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          smem_dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Loads one box of a 2-D tensor map into shared memory and counts its bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t smem_dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// TMA reduction: adds one box of shared memory (the tensor map's layout) into global memory, in the
// current bulk group.
__device__ __forceinline__ void tma_reduce_add_3d(uint32_t smem_src, const CUtensorMap* map, int c0, int c1, int c2) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
// Bulk groups: close the group of bulk operations issued so far; wait until every group has finished
// reading shared memory (the source may be overwritten), or has finished altogether.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to the async
// proxy (wgmma operands, TMA stores and reductions).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- named barriers and registers ------------------------------------------------------------------------
// Barrier `id` (1..15; 0 is __syncthreads) completes when `threads` threads have reached it by sync or arrive.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Moves registers between the warpgroups of a block: producers give theirs up, consumers take them.
template <int REGS>
__device__ __forceinline__ void registers_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void registers_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// ---- host: TMA descriptors -------------------------------------------------------------------------------
// Describes rows of a [tokens, heads, head_dim] tensor for TMA: box = `box_rows` tokens x one head x
// `box_cols` columns (box_cols x element_bytes = 128: one swizzle atom), 128-byte swizzle -- the layout wgmma
// reads and the backward's dQ reductions write from.
cudaError_t encode_rows_tensor_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int element_bytes,
                                   int64_t tokens, int heads, int head_dim, int box_cols, int box_rows);
// The bf16 Q/K/V/dO case: 64 head-dim columns per box.
inline cudaError_t encode_rows_tensor_map(CUtensorMap* map, const void* base, int64_t tokens, int heads, int head_dim,
                                          int box_rows) {
  return encode_rows_tensor_map(map, base, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, tokens, heads, head_dim, 64, box_rows);
}

// Describes an fp32 vector for TMA (as one row of `elements` values: a rank-1 map is refused by the CUDA 13.0
// driver): box = `box` consecutive values, which must start at a multiple of 4 (a box's first value must be
// 16-byte aligned: one that is not stops the kernel with an illegal instruction on an H200; `box` a multiple
// of 4 too). The backward's per-query LSE and Delta; the base must be 16-byte aligned.
cudaError_t encode_vector_tensor_map(CUtensorMap* map, const float* base, int64_t elements, int box);

}  // namespace cad::kernels::detail
