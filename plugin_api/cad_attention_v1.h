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
 *
 * ABI v1.1 (appended at the end of the structs below; a v1.0 host or plugin simply lacks them, which
 * `struct_size` tells):
 *  - Plans. `make_plan` turns what a batch looks like (a local backend's segment table, or a distributed
 *    backend's pieces) into an opaque plan handle, once: every forward and backward given that handle
 *    reuses the work lists, device index tables and buffers it holds, and a distributed backend does no
 *    host-side communication and no host synchronisation inside the call (CUDA-graph capturable when its
 *    communicator is). A trainer makes one plan per micro-batch and passes it to every layer.
 *  - Saved state. A forward given `saved != NULL` returns in *saved a handle to what its backward needs
 *    (e.g. a CAD server's copy of Q/K/V/O/LSE); the caller keeps it, as autograd keeps a context, passes
 *    it to that forward's backward and then releases it with `release_saved`. So any number of forwards
 *    may be in flight. *saved may be set to NULL (nothing kept); backward then needs none.
 *  - Handles (plans, saved state) belong to the instance that made them. A plan serves calls of the shape
 *    and pieces it was made for; a saved handle serves the backward of the forward that made it (the same
 *    plan, or without one the same shape and pieces; the same softmax_scale); a distributed backend's ranks
 *    each pass the state of the same forward, with the same scale. Each handle is released exactly once, on
 *    its instance, before that instance is destroyed. Breaking a rule is undefined unless the plugin says
 *    it checks it. The CAD plugin checks every rule above on every call and refuses a break with
 *    INVALID_ARGUMENT naming the handle and what differs, and refuses a release of a handle that is not live
 *    on the instance (see release_plan); except on its NCCL path, where the rules between ranks go unchecked
 *    (plugins/cad/README.md, "Handles"). Undefined everywhere: a handle used or released after its instance
 *    was destroyed, and a release racing another call on the same instance.
 *
 * ABI v1.2 (appended likewise; read only when the caller's struct_size covers them):
 *  - Sliding windows. Forward, backward and plan args carry `window_flags`, `window_left` and
 *    `window_right`. Only when window_flags has CAD_WINDOW_GIVEN (cad_common_v1.h) are window_left/right
 *    read (-1 = no limit, PyTorch's window_size); without it there is no window, whatever they hold, so a
 *    zero-initialised struct means plain attention. In a segment, query i sits at key position
 *    p = i + (kv_len - q_len) (the same bottom-right alignment as the causal mask) and sees keys
 *    [p - window_left, p + window_right] of its KV range, clipped to [0, kv_len) and, when causal, to
 *    j <= p. With causal = 1, window_right must be -1 or 0 (both mean "none after p"). A finite window (window_left >= 0, or window_right >= 0
 *    when not causal) is computed only by a backend that reports CAD_ATTENTION_CAP_WINDOW; a v1.2 backend
 *    without it refuses one with CAD_STATUS_UNSUPPORTED. A plugin built before v1.2 cannot see the
 *    fields, so a host passes a finite window only to a backend that reports the flag. A caller with a
 *    v1.1 struct gets no window. `reserved_v1_2` must be 0.
 */
#ifndef CAD_ATTENTION_V1_H
#define CAD_ATTENTION_V1_H

#include "cad_common_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes of the structs as ABI v1.0 defined them: a v1.1 callee accepts these (and reads no v1.1 field). */
#define CAD_ATTENTION_V1_0_TABLE_SIZE 64
#define CAD_ATTENTION_FORWARD_ARGS_V1_0_SIZE 96
#define CAD_ATTENTION_BACKWARD_ARGS_V1_0_SIZE 128
/* ... and as ABI v1.1 defined them (the v1.2 window_flags and window fields follow). */
#define CAD_ATTENTION_FORWARD_ARGS_V1_1_SIZE 112
#define CAD_ATTENTION_BACKWARD_ARGS_V1_1_SIZE 144
#define CAD_ATTENTION_PLAN_ARGS_V1_1_SIZE 96

/* Is the slot `member` of a struct the caller declared as `struct_size` bytes present? */
#define CAD_HAS_FIELD(type, ptr, member) \
  ((ptr)->struct_size >= offsetof(type, member) + sizeof(((type*)0)->member))

/* What an instance accepts. Bits of `dtype_mask`: */
enum { CAD_ATTENTION_DTYPE_FP32 = 1u << 0, CAD_ATTENTION_DTYPE_BF16 = 1u << 1 };
/* Bits of `flags`: */
enum {
  CAD_ATTENTION_CAP_CAUSAL = 1u << 0,
  CAD_ATTENTION_CAP_NONCAUSAL = 1u << 1,
  CAD_ATTENTION_CAP_GQA = 1u << 2,
  CAD_ATTENTION_CAP_SHARED_KV = 1u << 3, /* segments may overlap in K/V                          */
  CAD_ATTENTION_CAP_BACKWARD = 1u << 4,
  CAD_ATTENTION_CAP_PIECES = 1u << 5, /* consumes `pieces` (distributed), not `segments`           */
  CAD_ATTENTION_CAP_WINDOW = 1u << 6  /* ABI v1.2: computes finite sliding windows (window_left/right) */
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
  /* ---- ABI v1.1 ---- */
  void* plan;   /* a handle from make_plan, or NULL (then segments/pieces describe the batch). With a
                 * plan, segments/pieces may be NULL; when given they must equal the plan's.            */
  void** saved; /* NULL, or where the forward stores the handle its backward needs (see release_saved).
                 * Written only on success.                                                             */
  /* ---- ABI v1.2 ---- */
  uint32_t window_flags;   /* CAD_WINDOW_GIVEN: window_left/right are read; 0: no window (see the top)  */
  uint32_t reserved_v1_2;  /* must be 0 (keeps the window fields 8-aligned)                             */
  int64_t window_left;  /* keys before the query's position it may see; -1 = no limit (see the top)     */
  int64_t window_right; /* keys after it; -1 = no limit; must be -1 or 0 when causal                      */
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
  /* ---- ABI v1.1 ---- */
  void* plan;  /* the plan the forward ran with, or NULL                                              */
  void* saved; /* the handle that forward stored in *saved, or NULL (the backward then gets Q/K/V/O/LSE
                * from the tensors above). Borrowed: the caller still releases it.                       */
  /* ---- ABI v1.2 ---- */
  uint32_t window_flags;   /* the forward's: CAD_WINDOW_GIVEN or 0 (no window)                          */
  uint32_t reserved_v1_2;  /* must be 0                                                                 */
  int64_t window_left;  /* the forward's window                                                        */
  int64_t window_right;
} cad_attention_backward_args_v1_t;

/* What make_plan plans for (ABI v1.1). The tensors of every call made with the plan must have these
 * shapes and dtype; softmax_scale is per call. All pointers are borrowed for the make_plan call. */
typedef struct cad_attention_plan_args_v1 {
  size_t struct_size;
  const cad_segment_v1_t* segments; /* local backends: the batch's segment table                      */
  int64_t num_segments;
  const cad_piece_v1_t* pieces;     /* distributed backends: this rank's pieces, in token order        */
  int64_t num_pieces;
  int64_t num_q_rows;               /* local backends: Tq and Tk. Distributed: ignored (the pieces' sum) */
  int64_t num_kv_rows;
  int32_t num_q_heads;              /* Hq, Hkv, D of every call                                       */
  int32_t num_kv_heads;
  int32_t head_dim;
  cad_dtype_v1_t dtype;             /* of Q/K/V/O and the gradients                                   */
  int32_t causal;
  cad_device_v1_t device;           /* where the calls' tensors live                                  */
  void* stream;                     /* device tables are uploaded on it; calls must be ordered after it */
  /* ---- ABI v1.2 ---- */
  uint32_t window_flags;            /* CAD_WINDOW_GIVEN: window_left/right are read; 0: no window      */
  uint32_t reserved_v1_2;           /* must be 0                                                      */
  int64_t window_left;              /* the window every call made with the plan uses (-1 = no limit)   */
  int64_t window_right;
} cad_attention_plan_args_v1_t;

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
   * until the next call on it. Never NULL. A plugin whose instances may be called from several threads
   * keeps one message per calling thread (the project's plugins do), like errno. */
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

  /* ---- ABI v1.1: optional (may be NULL, or beyond a v1.0 plugin's struct_size) ---- */

  /* Make a plan (see the top of this file). On success *out_plan is owned by the caller until
   * release_plan. A distributed backend's make_plan is collective: every rank calls it, in the same
   * order relative to its other collective calls, and every rank fails alike (naming the rank at
   * fault). Calls that use one plan must be ordered (one stream, or streams the caller orders): the
   * plan's buffers are reused by each of them. An instance's calls come from one thread at a time unless
   * its plugin documents otherwise (plugin "cad" with a plan_communicator: make_plan on one thread while
   * another runs forward/backward, see plugins/cad/README.md). */
  cad_status_t (*make_plan)(void* ctx, const cad_attention_plan_args_v1_t* args, void** out_plan);
  /* Release a plan once every call that used it has been enqueued; device memory goes back in stream
   * order on the plan's stream. NULL is a no-op. Not collective. A plan released already, or made by another
   * instance: undefined, unless the plugin keeps a registry of its live handles (CAD does: it then frees
   * nothing, logs an error and sets last_error; it never reads through such a pointer). */
  void (*release_plan)(void* ctx, void* plan);
  /* Release a forward's saved state (after its backward was enqueued, or if none will come), in stream
   * order on that forward's stream. NULL is a no-op. Released already or another instance's: as release_plan. */
  void (*release_saved)(void* ctx, void* saved);
} cad_attention_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_ATTENTION_V1_H */
