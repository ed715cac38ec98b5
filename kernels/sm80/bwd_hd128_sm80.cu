// sm80/bwd_hd128_sm80.cu -- the portable backward kernel for head dim 128 (one instantiation per translation
// unit keeps CI's compile time and memory in check).
#include "sm80/bwd_launch.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_bwd<128>(const BwdParams& p, int num_items, cudaStream_t stream);
}  // namespace cad::kernels::detail
