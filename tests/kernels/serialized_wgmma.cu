// serialized_wgmma.cu -- a kernel that ptxas must serialize (a plain store to an accumulator register while its
// product is in flight): kernels/tools/check_wgmma_serialization.py must fail on it (ctest
// kernels.wgmma_serialization_check_detects_it), or its passing on the real kernels would prove nothing.
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_ops.cuh"
using namespace cad::kernels::detail;
__global__ void serialized(float* out, uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  float d[32];
  wgmma_fence();
  wgmma_m64n64k16_ss_first(d, da, db);
  wgmma_commit();
  d[0] = out[threadIdx.x];  // a non-wgmma write to an accumulator register while its product runs
  wgmma_m64n64k16_ss(d, da, db, 1);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] = d[i];
#endif
}
