/*
 * cad_callback_attention_v1.h -- the registration API of the "callback_attention" plugin, version 1.
 *
 * The plugin is an attention backend (segments, never pieces) whose forward and backward call functions that
 * the host process registered beforehand: a Python package's torch or FlashAttention-4 implementation, or a C
 * test's forwarder. It exports, besides its ABI entry symbol, the two functions below (looked up with dlsym on
 * the plugin's own object: open it with the host's cad_library_open, then dlopen the path cad_library_path
 * gives; the loader maps one object once, so both see one registry).
 *
 * Registration, ownership and lifetime (ONNX Runtime's custom-op libraries do the same with a registration
 * entry point and a versioned table):
 *  - The host registers a table under a key ([A-Za-z0-9_.-]+, at most 64 bytes) before it creates an instance
 *    whose config names that key: {"key": "torch"}. register copies the table (its struct_size bytes, zero past
 *    them); the caller's table may go away after the call. The function pointers and user_data must stay
 *    valid until `release` is called.
 *  - Each instance created with the key holds the registration until it is destroyed. unregister removes the
 *    key (later creates fail with NOT_FOUND); instances alive keep calling the callbacks. When the registration
 *    and every instance made from it are gone, `release(user_data)` is called once (if not NULL), from the
 *    thread that dropped the last one: the point after which the host may free what user_data points to.
 *  - The registry is the plugin's one process-wide state (a key is a process's name for its functions), guarded
 *    by a mutex: register/unregister are thread-safe and may race creates.
 *  - A key registered already is refused (INVALID_ARGUMENT); unregister it first.
 *
 * Calls: the plugin validates every argument as any backend does (tensors against the registered capabilities,
 * segments, window, stream NULL for CPU) before a callback runs, so a callback sees only well-formed batches,
 * and passes them on as full ABI v1.2 structs (struct_size = sizeof; window_flags = CAD_WINDOW_GIVEN with the
 * normalised window, -1 = no limit and window_right -1 when causal; plan and saved NULL: the plugin makes no
 * plans and keeps no state). `stream` is the call's: a CUDA callback enqueues its work on it and may return
 * before it completes, as any CUDA backend. The tensors and the segment table are borrowed for the call.
 * Callbacks must write every output (the ABI's output semantics: uncovered rows O = 0, LSE = -inf; dK/dV summed
 * where segments share K/V). Calls on one instance never overlap; several instances may call the same table
 * from several threads at once.
 *  - Errors: a callback returns a cad_status_t. On failure it writes a NUL-terminated message into `error`
 *    (capacity `error_capacity`, zeroed before the call); the plugin returns that status (INTERNAL for a value
 *    outside the enum) and its last_error says "forward callback 'KEY' failed: MESSAGE". No C++ exception,
 *    longjmp or foreign exception may leave a callback (a Python callback catches everything itself).
 *
 * Compiles as C99 and as C++17.
 */
#ifndef CAD_CALLBACK_ATTENTION_V1_H
#define CAD_CALLBACK_ATTENTION_V1_H

#include "cad_attention_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CAD_CALLBACK_ATTENTION_VERSION 1
#define CAD_CALLBACK_ATTENTION_REGISTER_SYMBOL_V1 "cad_callback_attention_register_v1"
#define CAD_CALLBACK_ATTENTION_UNREGISTER_SYMBOL_V1 "cad_callback_attention_unregister_v1"
#define CAD_CALLBACK_ATTENTION_MAX_KEY 64

typedef cad_status_t (*cad_callback_forward_fn)(void* user_data, const cad_attention_forward_args_v1_t* args,
                                                char* error, size_t error_capacity);
typedef cad_status_t (*cad_callback_backward_fn)(void* user_data, const cad_attention_backward_args_v1_t* args,
                                                 char* error, size_t error_capacity);
typedef void (*cad_callback_release_fn)(void* user_data);

/* What a host registers. Grows only at the end; struct_size is sizeof as the host knows it. */
typedef struct cad_callback_attention_v1 {
  size_t struct_size;
  uint32_t version; /* CAD_CALLBACK_ATTENTION_VERSION the host was built against                        */
  uint32_t reserved; /* must be 0                                                                      */
  /* What the callbacks compute, reported as the instances' capabilities (its struct_size is ignored).
   * device_type CPU or CUDA; dtype_mask a non-empty subset of FP32 | BF16; flags without CAP_PIECES;
   * CAP_BACKWARD requires `backward`. CAD's servers also need CAP_SHARED_KV. */
  cad_attention_capabilities_v1_t capabilities;
  void* user_data;                  /* passed back to every callback and to release                     */
  cad_callback_forward_fn forward;  /* required                                                          */
  cad_callback_backward_fn backward; /* NULL: the instances refuse backward (UNSUPPORTED)                */
  cad_callback_release_fn release;  /* optional; see "lifetime" above                                    */
} cad_callback_attention_v1_t;

/* Register `callbacks` under `key`. On failure returns INVALID_ARGUMENT (bad key, key taken, a table that
 * breaks a rule above) or ABI_MISMATCH (struct_size or version unknown) and writes the message into `error`
 * (may be NULL when error_capacity is 0); nothing is registered then and release is not called. */
typedef cad_status_t (*cad_callback_attention_register_v1_fn)(const char* key,
                                                              const cad_callback_attention_v1_t* callbacks,
                                                              char* error, size_t error_capacity);
/* Remove `key` from the registry (NOT_FOUND if it is not there). See "lifetime" above. */
typedef cad_status_t (*cad_callback_attention_unregister_v1_fn)(const char* key, char* error, size_t error_capacity);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_CALLBACK_ATTENTION_V1_H */
