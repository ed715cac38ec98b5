// sm80/fwd_hd64_sm80.cu -- the portable forward kernel for head dim 64 (one instantiation per translation unit keeps
// CI's compile time and memory in check).
#include "sm80/fwd_launch.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_fwd<64>(const FwdParams& p, int num_items, cudaStream_t stream);
}  // namespace cad::kernels::detail
