// sm90/fwd_hd64_sm90.cu -- the Hopper (wgmma) forward kernel for head dim 64; a stub in non-sm_90a passes.
#include "sm90/fwd_launch.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_fwd_sm90<64>(const FwdParams& p, int num_items, cudaStream_t stream);
template bool attention_fwd_sm90_loaded<64>();
}  // namespace cad::kernels::detail
