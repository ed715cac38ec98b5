// sm90/tma_descriptor.cpp -- host side of sm90/async.cuh: TMA descriptors for [tokens, heads, head_dim] bf16
// tensors. The encoder lives in the driver (libcuda); it is looked up through the runtime once, so the
// kernels library does not link libcuda directly.
#include <cudaTypedefs.h>

#include <mutex>

#include "sm90/async.cuh"

namespace cad::kernels::detail {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encoder = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
      encoder = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    } else {
      cudaGetLastError();
    }
  });
  return encoder;
}

}  // namespace

cudaError_t encode_rows_tensor_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int element_bytes,
                                   int64_t tokens, int heads, int head_dim, int box_cols, int box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  // TMA needs a 16-byte aligned base and at least one row; an empty tensor is never read, so any valid
  // one-row shape will do for it.
  if ((reinterpret_cast<uintptr_t>(base) & 15) != 0) return cudaErrorMisalignedAddress;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(tokens > 0 ? tokens : 1)};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(head_dim) * element_bytes;
  const cuuint64_t strides[2] = {row_bytes, row_bytes * heads};  // bytes between heads, between tokens
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, dtype, 3, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t encode_vector_tensor_map(CUtensorMap* map, const float* base, int64_t elements, int box) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  if ((reinterpret_cast<uintptr_t>(base) & 15) != 0) return cudaErrorMisalignedAddress;
  const cuuint64_t n = static_cast<cuuint64_t>(elements > 0 ? elements : 1);
  const cuuint64_t dims[2] = {n, 1};
  const cuuint64_t strides[1] = {(n * sizeof(float) + 15) / 16 * 16};
  const cuuint32_t box_dims[2] = {static_cast<cuuint32_t>(box), 1};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(base), dims, strides, box_dims,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace cad::kernels::detail
