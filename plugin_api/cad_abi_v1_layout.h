/*
 * cad_abi_v1_layout.h -- freezes ABI v1: the size and offset of every v1 struct on LP64 targets
 * (x86-64 and aarch64 Linux). Any edit that moves a field fails to compile here. Included by the
 * plugin API's own compile test and by every plugin build; hosts may include it too.
 */
#ifndef CAD_ABI_V1_LAYOUT_H
#define CAD_ABI_V1_LAYOUT_H

#include "cad_plugin_v1.h"

#if defined(__cplusplus)
#define CAD_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define CAD_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#else /* C99: a negative array size stops the build; the message is in the typedef's name line */
#define CAD_STATIC_ASSERT_CAT2(a, b) a##b
#define CAD_STATIC_ASSERT_CAT(a, b) CAD_STATIC_ASSERT_CAT2(a, b)
#define CAD_STATIC_ASSERT(cond, msg) \
  typedef char CAD_STATIC_ASSERT_CAT(cad_abi_v1_frozen_line_, __LINE__)[(cond) ? 1 : -1]
#endif

#define CAD_FROZEN(type, member, offset) \
  CAD_STATIC_ASSERT(offsetof(type, member) == (offset), #type "." #member " moved: ABI v1 is frozen")
#define CAD_FROZEN_SIZE(type, size) CAD_STATIC_ASSERT(sizeof(type) == (size), #type " changed size: ABI v1 is frozen")

CAD_STATIC_ASSERT(sizeof(void*) == 8 && sizeof(size_t) == 8, "ABI v1 is defined for LP64 targets");

CAD_FROZEN_SIZE(cad_device_v1_t, 8);
CAD_FROZEN_SIZE(cad_dtype_v1_t, 4);
CAD_FROZEN_SIZE(cad_tensor_v1_t, 48);
CAD_FROZEN(cad_tensor_v1_t, data, 0);
CAD_FROZEN(cad_tensor_v1_t, device, 8);
CAD_FROZEN(cad_tensor_v1_t, ndim, 16);
CAD_FROZEN(cad_tensor_v1_t, dtype, 20);
CAD_FROZEN(cad_tensor_v1_t, shape, 24);
CAD_FROZEN(cad_tensor_v1_t, strides, 32);
CAD_FROZEN(cad_tensor_v1_t, byte_offset, 40);

CAD_FROZEN_SIZE(cad_piece_v1_t, 32);
CAD_FROZEN_SIZE(cad_task_v1_t, 32);
CAD_FROZEN(cad_task_v1_t, server, 24);
CAD_FROZEN_SIZE(cad_segment_v1_t, 32);
CAD_FROZEN(cad_segment_v1_t, kv_len, 24);

CAD_FROZEN_SIZE(cad_host_services_v1_t, 104); /* v1.0: 80 */
CAD_FROZEN(cad_host_services_v1_t, host_all_to_all_v, CAD_HOST_SERVICES_V1_0_SIZE);
CAD_FROZEN(cad_host_services_v1_t, host_all_gather, 88);
CAD_FROZEN(cad_host_services_v1_t, host_barrier, 96);
CAD_FROZEN(cad_host_services_v1_t, host_ctx, 16);
CAD_FROZEN(cad_host_services_v1_t, log, 32);
CAD_FROZEN(cad_host_services_v1_t, allocate, 40);
CAD_FROZEN(cad_host_services_v1_t, free, 48);
CAD_FROZEN(cad_host_services_v1_t, lookup_plugin, 56);
CAD_FROZEN(cad_host_services_v1_t, bootstrap_all_gather, 64);
CAD_FROZEN(cad_host_services_v1_t, bootstrap_world_size, 76);

CAD_FROZEN_SIZE(cad_attention_capabilities_v1_t, 32);
CAD_FROZEN_SIZE(cad_attention_forward_args_v1_t, 136); /* v1.0: 96, v1.1: 112 */
CAD_FROZEN(cad_attention_forward_args_v1_t, window_flags, CAD_ATTENTION_FORWARD_ARGS_V1_1_SIZE);
CAD_FROZEN(cad_attention_forward_args_v1_t, reserved_v1_2, 116);
CAD_FROZEN(cad_attention_forward_args_v1_t, window_left, 120);
CAD_FROZEN(cad_attention_forward_args_v1_t, window_right, 128);
CAD_FROZEN(cad_attention_forward_args_v1_t, plan, CAD_ATTENTION_FORWARD_ARGS_V1_0_SIZE);
CAD_FROZEN(cad_attention_forward_args_v1_t, saved, 104);
CAD_FROZEN(cad_attention_forward_args_v1_t, softmax_scale, 40);
CAD_FROZEN(cad_attention_forward_args_v1_t, stream, 48);
CAD_FROZEN(cad_attention_forward_args_v1_t, lse, 88);
CAD_FROZEN_SIZE(cad_attention_backward_args_v1_t, 168); /* v1.0: 128, v1.1: 144 */
CAD_FROZEN(cad_attention_backward_args_v1_t, window_flags, CAD_ATTENTION_BACKWARD_ARGS_V1_1_SIZE);
CAD_FROZEN(cad_attention_backward_args_v1_t, reserved_v1_2, 148);
CAD_FROZEN(cad_attention_backward_args_v1_t, window_left, 152);
CAD_FROZEN(cad_attention_backward_args_v1_t, window_right, 160);
CAD_FROZEN(cad_attention_backward_args_v1_t, plan, CAD_ATTENTION_BACKWARD_ARGS_V1_0_SIZE);
CAD_FROZEN(cad_attention_backward_args_v1_t, saved, 136);
CAD_FROZEN_SIZE(cad_attention_plan_args_v1_t, 120); /* v1.1: 96 */
CAD_FROZEN(cad_attention_plan_args_v1_t, window_flags, CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE);
CAD_FROZEN(cad_attention_plan_args_v1_t, reserved_v1_2, 100);
CAD_FROZEN(cad_attention_plan_args_v1_t, window_left, 104);
CAD_FROZEN(cad_attention_plan_args_v1_t, window_right, 112);
CAD_FROZEN(cad_attention_plan_args_v1_t, num_q_rows, 40);
CAD_FROZEN(cad_attention_plan_args_v1_t, dtype, 68);
CAD_FROZEN(cad_attention_plan_args_v1_t, device, 76);
CAD_FROZEN(cad_attention_plan_args_v1_t, stream, 88);
CAD_FROZEN(cad_attention_backward_args_v1_t, d_o, 96);
CAD_FROZEN(cad_attention_backward_args_v1_t, d_v, 120);
CAD_FROZEN_SIZE(cad_attention_v1_t, 88); /* v1.0: 64 */
CAD_FROZEN(cad_attention_v1_t, make_plan, CAD_ATTENTION_V1_0_TABLE_SIZE);
CAD_FROZEN(cad_attention_v1_t, release_saved, 80);
CAD_FROZEN(cad_attention_v1_t, forward, 40);
CAD_FROZEN(cad_attention_v1_t, get_stats_json, 56);

CAD_FROZEN_SIZE(cad_communicator_v1_t, 80);
CAD_FROZEN(cad_communicator_v1_t, all_to_all_v, 56);
CAD_FROZEN(cad_communicator_v1_t, barrier, 72);

CAD_FROZEN_SIZE(cad_cost_params_v1_t, 72); /* v1.1: 48 */
CAD_FROZEN(cad_cost_params_v1_t, window_flags, CAD_COST_PARAMS_V1_1_SIZE);
CAD_FROZEN(cad_cost_params_v1_t, reserved_v1_2, 52);
CAD_FROZEN(cad_cost_params_v1_t, window_left, 56);
CAD_FROZEN(cad_cost_params_v1_t, window_right, 64);
CAD_FROZEN_SIZE(cad_rank_pieces_v1_t, 16);
CAD_FROZEN_SIZE(cad_balance_input_v1_t, 32);
CAD_FROZEN_SIZE(cad_plan_v1_t, 32);
CAD_FROZEN_SIZE(cad_balancer_v1_t, 48);

CAD_FROZEN_SIZE(cad_plugin_v1_t, 72);
CAD_FROZEN(cad_plugin_v1_t, kind, 16);
CAD_FROZEN(cad_plugin_v1_t, name, 24);
CAD_FROZEN(cad_plugin_v1_t, attention, 48);
CAD_FROZEN(cad_plugin_v1_t, balancer, 64);

#endif /* CAD_ABI_V1_LAYOUT_H */
