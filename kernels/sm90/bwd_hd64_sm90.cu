// sm90/bwd_hd64_sm90.cu -- the Hopper (wgmma) backward kernel, head dim 64; a stub in non-sm_90a passes.
#include "sm90/bwd_launch.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_bwd_sm90<64>(const BwdParams& p, int num_items, bool heads_inner,
                                                   cudaStream_t stream);
}  // namespace cad::kernels::detail
