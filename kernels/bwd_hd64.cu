// bwd_hd64.cu -- the backward kernel for head dim 64 (one instantiation per translation unit).
#include "attention_bwd.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_bwd<64>(const BwdParams& p, int num_items, cudaStream_t stream);
}  // namespace cad::kernels::detail
