/*
 * cad_balancer_v1.h -- the balancer plugin kind, ABI major version 1. FROZEN (see cad_common_v1.h for
 * the conventions every function follows).
 *
 * A balancer turns the piece tables of all ranks into a plan: the CA-tasks of one step and the server
 * that computes each. It is pure CPU, deterministic (the same inputs give a byte-identical plan on
 * every rank and every run) and keeps no state between calls beyond its config.
 *
 * Plan invariant: for every document, the tasks' query ranges [q_begin, q_end) partition [0, doc_len)
 * exactly once. Tasks are sorted by (server, doc_id, q_begin).
 *
 * Threading: `plan` may be called concurrently on different contexts; calls on one context must not
 * overlap.
 */
#ifndef CAD_BALANCER_V1_H
#define CAD_BALANCER_V1_H

#include "cad_common_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the plan's data format (the cad_plan_v1_t layout and its invariants). */
#define CAD_PLAN_FORMAT_VERSION 1

/* The size of cad_cost_params_v1_t before ABI v1.2 appended the window: a v1.2 balancer accepts it. */
#define CAD_COST_PARAMS_V1_1_SIZE 48

/* What one step costs, as the balancer models it. */
typedef struct cad_cost_params_v1 {
  size_t struct_size;
  int32_t num_q_heads;       /* Hq                                                                   */
  int32_t num_kv_heads;      /* Hkv                                                                  */
  int32_t head_dim;          /* D                                                                    */
  int32_t bytes_per_element; /* 2 for bf16, 4 for fp32                                               */
  int32_t causal;            /* 1: causal task cost q*kv - q*(q-1)/2; 0: q*doc_len                   */
  int32_t reserved;          /* must be 0                                                            */
  int64_t min_shard_tokens;  /* the kernel's efficient minimum: no task shorter than this unless the
                                whole document (or the remainder of one) is shorter                  */
  int64_t memory_cap_bytes;  /* most bytes of Q/K/V/O a server may receive; 0 = no cap               */
  /* ---- ABI v1.2 (read only when struct_size covers it) ---- */
  uint32_t window_flags;     /* CAD_WINDOW_GIVEN (cad_common_v1.h): window_left/right are read; without
                                it there is no window, whatever they hold (a zeroed struct: none)       */
  uint32_t reserved_v1_2;    /* must be 0                                                            */
  int64_t window_left;       /* sliding window of the attention (cad_attention_v1.h); -1 = no limit. A task's
                                query at document position p then reads keys [max(0, p - window_left),
                                p] when causal, so it costs min(p + 1, window_left + 1) keys             */
  int64_t window_right;      /* -1 = no limit; -1 or 0 when causal                                     */
} cad_cost_params_v1_t;

/* The pieces of one rank, in that rank's token order. */
typedef struct cad_rank_pieces_v1 {
  const cad_piece_v1_t* pieces;
  int64_t num_pieces;
} cad_rank_pieces_v1_t;

typedef struct cad_balance_input_v1 {
  size_t struct_size;
  const cad_rank_pieces_v1_t* ranks; /* num_ranks entries; rank r is also server r                  */
  int32_t num_ranks;
  int32_t num_servers;               /* servers 0..num_servers-1; equal to num_ranks in CAD          */
  const cad_cost_params_v1_t* cost;
} cad_balance_input_v1_t;

/* A plan, allocated by the balancer and owned by the caller until released with release_plan. */
typedef struct cad_plan_v1 {
  size_t struct_size;
  uint32_t format_version; /* CAD_PLAN_FORMAT_VERSION                                              */
  int32_t num_servers;
  const cad_task_v1_t* tasks;
  int64_t num_tasks;
} cad_plan_v1_t;

typedef struct cad_balancer_v1 {
  size_t struct_size; /* sizeof(cad_balancer_v1_t) as the plugin was built */

  /* Same contract as cad_attention_v1_t::create. */
  cad_status_t (*create)(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                         char* error_message, size_t error_capacity);
  void (*destroy)(void* ctx);
  const char* (*last_error)(void* ctx);

  /* Compute a plan. Validates the input first (pieces of a document must tile [0, doc_len) exactly
   * once across all ranks with one agreed doc_len; lengths >= 1) and refuses bad input with
   * CAD_STATUS_INVALID_ARGUMENT naming the rank, piece and document. On success *out_plan is a new
   * plan owned by the caller. */
  cad_status_t (*plan)(void* ctx, const cad_balance_input_v1_t* input, cad_plan_v1_t** out_plan);

  /* Free a plan returned by `plan` on this context. NULL is a no-op. */
  void (*release_plan)(void* ctx, cad_plan_v1_t* plan);
} cad_balancer_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_BALANCER_V1_H */
