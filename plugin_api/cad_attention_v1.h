/*
 * cad_attention_v1.h -- the attention-backend plugin kind, ABI major version 1. FROZEN (see
 * cad_common_v1.h for the conventions every function follows).
 *
 * An attention backend computes varlen core attention, softmax(scale * Q K^T) V, over a batch of
 * segments (cad_segment_v1_t), forward and backward. Tensor shapes (row-major, last dim contiguous):
 *   Q, O, dO, dQ : [Tq, Hq, D]      K, V, dK, dV : [Tk, Hkv, D]      LSE : [Hq, Tq] fp32
 * with Hq % Hkv == 0 (grouped-query attention: query head h reads KV head h / (Hq / Hkv)).
 * LSE is the natural-log log-sum-exp of the scaled scores of each query row.
 *
 * A distributed backend (the CAD plugin) instead consumes `pieces`: the host's local tokens
 * described as pieces of documents, in token order; it reports CAD_ATTENTION_CAP_PIECES.
 *
 * Output semantics (both kinds of backend): every output tensor is fully written. Rows of O/dQ not
 * covered by any segment are set to 0 and their LSE to -infinity; rows of dK/dV receive the sum over
 * every segment that reads them (0 if none). On error, outputs are untouched only when the error is
 * detected before any work is enqueued (argument validation); a device error mid-way leaves them
 * unspecified and is reported as CAD_STATUS_DEVICE_ERROR.
 *
 * Streams: `stream` is a cudaStream_t for CUDA tensors (NULL = legacy default stream) and must be NULL
 * for CPU tensors. A CUDA backend only enqueues work on `stream`; it returns before completion and the
 * caller synchronises. A CPU backend returns when results are written.
 *
 * Threading: calls on one context must not overlap; different contexts are independent.
 */
#ifndef CAD_ATTENTION_V1_H
#define CAD_ATTENTION_V1_H

#include "cad_common_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What an instance accepts. Bits of `dtype_mask`: */
enum { CAD_ATTENTION_DTYPE_FP32 = 1u << 0, CAD_ATTENTION_DTYPE_BF16 = 1u << 1 };
/* Bits of `flags`: */
enum {
  CAD_ATTENTION_CAP_CAUSAL = 1u << 0,
  CAD_ATTENTION_CAP_NONCAUSAL = 1u << 1,
  CAD_ATTENTION_CAP_GQA = 1u << 2,
  CAD_ATTENTION_CAP_SHARED_KV = 1u << 3, /* segments may overlap in K/V                          */
  CAD_ATTENTION_CAP_BACKWARD = 1u << 4,
  CAD_ATTENTION_CAP_PIECES = 1u << 5 /* consumes `pieces` (distributed), not `segments`            */
};

typedef struct cad_attention_capabilities_v1 {
  size_t struct_size;             /* set by the caller                                              */
  cad_device_type_t device_type;  /* where tensors must live                                        */
  uint32_t dtype_mask;            /* CAD_ATTENTION_DTYPE_* accepted for Q/K/V/O/dO/dQ/dK/dV          */
  uint32_t flags;                 /* CAD_ATTENTION_CAP_*                                             */
  uint32_t head_dim_mask;         /* bit i set: head dim 16*(i+1) supported (bit 3 = 64, bit 7 = 128) */
  int32_t max_head_dim;           /* largest supported head dim                                      */
  int32_t min_compute_capability; /* CUDA: e.g. 80 for sm_80; 0 for CPU                              */
} cad_attention_capabilities_v1_t;

/* Arguments of one forward call. All pointers borrowed for the call. */
typedef struct cad_attention_forward_args_v1 {
  size_t struct_size;
  const cad_segment_v1_t* segments; /* local backends: the server batch's segment table            */
  int64_t num_segments;             /* 0 is a valid, empty batch                                    */
  const cad_piece_v1_t* pieces;     /* distributed backends: the host's local pieces, in token order */
  int64_t num_pieces;
  float softmax_scale;              /* usually 1/sqrt(D)                                             */
  int32_t causal;                   /* 1: causal, bottom-right aligned; 0: full                      */
  void* stream;                     /* cudaStream_t or NULL                                          */
  const cad_tensor_v1_t* q;         /* [Tq, Hq, D]                                                    */
  const cad_tensor_v1_t* k;         /* [Tk, Hkv, D]                                                   */
  const cad_tensor_v1_t* v;         /* [Tk, Hkv, D]                                                   */
  cad_tensor_v1_t* o;               /* out: [Tq, Hq, D], same dtype as q                             */
  cad_tensor_v1_t* lse;             /* out: [Hq, Tq], fp32                                           */
} cad_attention_forward_args_v1_t;

/* Arguments of one backward call: the forward's inputs and outputs plus dO; writes dQ, dK, dV. */
typedef struct cad_attention_backward_args_v1 {
  size_t struct_size;
  const cad_segment_v1_t* segments;
  int64_t num_segments;
  const cad_piece_v1_t* pieces;
  int64_t num_pieces;
  float softmax_scale;
  int32_t causal;
  void* stream;
  const cad_tensor_v1_t* q;
  const cad_tensor_v1_t* k;
  const cad_tensor_v1_t* v;
  const cad_tensor_v1_t* o;   /* the forward's output                                              */
  const cad_tensor_v1_t* lse; /* the forward's LSE                                                 */
  const cad_tensor_v1_t* d_o; /* gradient of the loss w.r.t. O: [Tq, Hq, D]                         */
  cad_tensor_v1_t* d_q;       /* out: [Tq, Hq, D]                                                   */
  cad_tensor_v1_t* d_k;       /* out: [Tk, Hkv, D]                                                  */
  cad_tensor_v1_t* d_v;       /* out: [Tk, Hkv, D]                                                  */
} cad_attention_backward_args_v1_t;

typedef struct cad_attention_v1 {
  size_t struct_size; /* sizeof(cad_attention_v1_t) as the plugin was built; the host reads no slot past it */

  /* Create an instance. `services` is borrowed and must outlive the instance. `config_json` is a JSON
   * object (may be "{}" or NULL for defaults), copied by the callee; unknown keys are logged as
   * warnings. On success *out_ctx owns the instance. On failure returns a non-OK status, leaves
   * *out_ctx untouched, and writes a NUL-terminated message (truncated to error_capacity) into
   * `error_message` (may be NULL if error_capacity is 0). Thread-safe. */
  cad_status_t (*create)(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                         char* error_message, size_t error_capacity);

  /* Destroy an instance and everything it owns; joins any thread it started. NULL is a no-op. */
  void (*destroy)(void* ctx);

  /* The message of the last failed call on this context, or "" if none. Owned by the context, valid
   * until the next call on it. Never NULL. */
  const char* (*last_error)(void* ctx);

  /* Fill *out (the caller sets out->struct_size). */
  cad_status_t (*get_capabilities)(void* ctx, cad_attention_capabilities_v1_t* out);

  cad_status_t (*forward)(void* ctx, const cad_attention_forward_args_v1_t* args);
  cad_status_t (*backward)(void* ctx, const cad_attention_backward_args_v1_t* args);

  /* Optional (may be NULL): statistics of the last forward/backward as a JSON object (e.g. per-server
   * cost, bytes moved, timings). Writes at most `capacity` bytes including the NUL into `buffer` and
   * the full length including the NUL into *needed; returns CAD_STATUS_INVALID_ARGUMENT if it did
   * not fit (call again with a larger buffer). */
  cad_status_t (*get_stats_json)(void* ctx, char* buffer, size_t capacity, size_t* needed);
} cad_attention_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_ATTENTION_V1_H */
