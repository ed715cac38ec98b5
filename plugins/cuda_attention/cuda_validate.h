// cuda_validate.h -- host-side checks of a forward/backward call of the "cuda" backend: everything is
// refused before any work is enqueued, with a message naming the tensor or argument at fault.
#pragma once

#include "cad_attention_v1.h"
#include "cad_kernels.h"

namespace cad::cuda_backend {

// Checks the call's scalars, q/k/v and the segment table; returns the problem they describe.
// `device_id` is the CUDA device the instance was created for.
kernels::AttentionProblem check_forward(const cad_attention_forward_args_v1_t* args, int device_id);
kernels::AttentionProblem check_backward(const cad_attention_backward_args_v1_t* args, int device_id);
// make_plan's arguments (segments against num_q_rows/num_kv_rows; device, dtype, heads).
kernels::AttentionProblem check_plan(const cad_attention_plan_args_v1_t* args, int device_id);

}  // namespace cad::cuda_backend
