// sm80/bwd_hd64_sm80.cu -- the portable backward kernel for head dim 64 (one instantiation per translation
// unit keeps CI's compile time and memory in check).
#include "sm80/bwd_launch.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_bwd<64>(const BwdParams& p, int num_items, cudaStream_t stream);
}  // namespace cad::kernels::detail
