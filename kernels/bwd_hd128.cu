// bwd_hd128.cu -- the backward kernel for head dim 128 (one instantiation per translation unit).
#include "attention_bwd.cuh"

namespace cad::kernels::detail {
template cudaError_t launch_attention_bwd<128>(const BwdParams& p, int num_items, cudaStream_t stream);
}  // namespace cad::kernels::detail
