// sm90/bwd_hd128_sm90.cu -- the Hopper (wgmma) backward kernel, head dim 128; a stub in non-sm_90a passes.
#include "sm90/bwd_launch.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_bwd_sm90<128>(const BwdParams& p, int num_items, bool heads_inner,
                                                    cudaStream_t stream);
}  // namespace cad::kernels::detail
