// device_path.h -- CAD's CUDA data path (DESIGN.md steps 3-5 on the GPU).
//
// A call moves each direction's tensors in ONE all_to_all_v per head group (one group unless head_groups asks for
// more; context.h), the rows for each peer packed together (row-range copy kernels over index tables built once
// per plan and kept in device memory, wire_tables.h):
//   owner tensors --pack--> send buffer --all_to_all_v--> receive buffer --unpack--> server batch tensors
// and back. The rows a rank sends itself never travel: they are copied from the source tensor straight into the
// destination beside the collective where one side holds them as one range (the server batch is laid out in
// document id order, layout.h: one range for documents numbered rank by rank), else packed into the receive buffer. LSE ([Hq, T] fp32) moves as wire rows [T, Hq] through a strided copy. Partial dK/dV coming back to
// a key/value owner: a row read by one server is moved; a row read by several is summed in fp32 over them in rank
// order, in one pass (bitwise reproducible). Measured on 2 H200s over the copy engines (bench/results/trainer_h200x2_2026-11-28_3c8dbea):
// one collective per tensor, each waited for before the next was packed, left the link idle between tensors.
// With head groups G > 1 the server batch is laid out group after group ([G][rows][H/G][D]; copy_row_slices moves
// a head slice of every row); every group's inbound collective is enqueued at once, then the tasks run in place
// (on the owner's own tensors, while the rows are in flight; own_tasks_in_place); the server computes group g once
// its collective is joined, enqueues group g's outbound collective (O and LSE; dQ, and dK and dV each with the
// moved/summed rule) and goes on with group g + 1; the outbound ones are joined at the end. Where tasks run in
// place, every dK/dV row coming back is added to the owner's own partial sums. The same tables serve every group
// count: a group changes a row's bytes and stride, never which rows move.
//
// The collectives run on the instance's communication stream, joined to the caller's stream with events
// (NCCL), or are staged through pinned host buffers when the communicator works on host memory (MPI),
// which synchronises the caller's stream at each exchange (wire_device.h). With a plan and NCCL nothing here
// synchronises the host: a forward and backward can be captured into a CUDA graph.
//
// Files: device_path.cpp (the forward and backward below), device_plan.h (a plan's tables), device_memory.h (device
// buffers, a call's scratch, the kept state), mover.h (the exchange engine), wire_device.h (NCCL and host-staged
// wires), schedule.h (head groups and the tasks run in place), gpu_timing.h, device_runtime.h, pack.h (the copy
// kernels).
#pragma once

#include <cstdint>

#include "context.h"

namespace cad::cad_plugin {

// False in builds without CUDA (CAD_ENABLE_CUDA=OFF).
bool device_path_available();

// A call's stream must belong to its tensors' device (the NULL stream is the current device's: that
// device must be the tensors'). Throws INVALID_ARGUMENT naming both devices.
void check_call_stream(void* stream, int device_id, const char* what);

// Device resources of a plan: index tables, staging and scratch buffers. Rank-local; throws on failure
// (make_cad_plan agrees on the outcome). The tables go up in `stream`'s order without a host wait; a call on
// another stream waits for the plan's ready event on the GPU.
// `head_groups`: the calls' server batch runs (and its rows move) a head group at a time (1: all heads at once).
DevicePlan* make_device_plan(CadContext& ctx, const Step& step, int32_t head_groups, void* stream);
void release_device_plan(CadContext& ctx, DevicePlan* plan);
int64_t device_plan_bytes(DevicePlan& plan);

// Adds the exchanges and calls that completed since the last look to ctx.stats.gpu_exchange and gpu_calls (never
// waits for the GPU).
void harvest_gpu_times(CadContext& ctx);

// One forward / backward on CUDA tensors (already checked against the plan). `keep` (forward): where
// the server batch's Q/K/V/O/LSE go for the backward, or NULL (they stay in the plan's scratch).
// `saved` (backward): that state, or NULL (the owners re-send Q/K/V/O/LSE).
// `drain`: this rank's call is invalid (`args` tensors must not be touched): run the same collectives
// on scratch buffers so that no peer waits forever, compute nothing.
void device_forward(CadContext& ctx, CadPlan& plan, const CallShape& shape, const cad_attention_forward_args_v1_t* args,
                    Saved* keep, CallStats& stats, bool drain = false);
void device_backward(CadContext& ctx, CadPlan& plan, const CallShape& shape,
                     const cad_attention_backward_args_v1_t* args, Saved* saved, CallStats& stats, bool drain = false);

}  // namespace cad::cad_plugin
