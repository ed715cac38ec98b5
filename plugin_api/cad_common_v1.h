/*
 * cad_common_v1.h -- types shared by every plugin kind of the CAD plugin ABI, major version 1.
 *
 * FROZEN: ABI v1 is released. Fields may only be appended at the end of a struct (and the struct's
 * `struct_size` grows with them); nothing here may be reordered, resized or removed. The static
 * asserts in cad_abi_v1_layout.h pin every size and offset.
 *
 * Conventions that hold for every function of every v1 table:
 *  - Every function that can fail returns a cad_status_t. CAD_STATUS_OK (0) is success.
 *  - On failure, outputs are left untouched, and the context's `last_error` call returns a
 *    NUL-terminated, human-readable message naming the argument, key or tensor at fault.
 *  - No C++ exception, longjmp or signal crosses the boundary.
 *  - Pointers passed *into* a call are borrowed for the duration of that call only, unless the
 *    function's comment says otherwise. Strings are UTF-8 and NUL-terminated.
 *  - Every struct that may grow starts with `size_t struct_size`, which the caller sets to
 *    sizeof(the struct as it knows it). A callee never reads a field that lies beyond struct_size.
 *
 * Compiles as C99 and as C++17.
 */
#ifndef CAD_COMMON_V1_H
#define CAD_COMMON_V1_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ABI version of these headers. The major is part of the entry symbol's name (cad_plugin_entry_v1);
 * the minor grows when a field is appended to a struct. */
#define CAD_ABI_VERSION_MAJOR 1
#define CAD_ABI_VERSION_MINOR 2

/* ------------------------------------------------------------------------------------------------ */
/* Status codes: one frozen enum for the whole ABI. Values never change; new codes are appended.      */
/* ------------------------------------------------------------------------------------------------ */
typedef int32_t cad_status_t;
enum {
  CAD_STATUS_OK = 0,
  CAD_STATUS_INVALID_ARGUMENT = 1, /* a pointer, shape, dtype, stride, device or value is wrong     */
  CAD_STATUS_UNSUPPORTED = 2,      /* well-formed input this implementation does not handle          */
  CAD_STATUS_OUT_OF_MEMORY = 3,    /* an allocation (host service or the plugin's own) failed         */
  CAD_STATUS_INVALID_CONFIG = 4,   /* the JSON config is malformed, has a wrong type or range         */
  CAD_STATUS_NOT_FOUND = 5,        /* a named plugin instance, file or key does not exist            */
  CAD_STATUS_COMMUNICATION = 6,    /* a collective failed (MPI/NCCL error, peer gone, mismatch)       */
  CAD_STATUS_TIMEOUT = 7,          /* an operation ran past its configured timeout and was aborted   */
  CAD_STATUS_ABI_MISMATCH = 8,     /* a table, struct or version the callee cannot use               */
  CAD_STATUS_DEVICE_ERROR = 9,     /* the accelerator runtime reported an error                       */
  CAD_STATUS_INTERNAL = 10         /* a bug: an invariant the implementation relies on was broken     */
};

/* Bits of `window_flags` (ABI v1.2: cad_attention_forward/backward/plan_args_v1_t, cad_cost_params_v1_t).
 * CAD_WINDOW_GIVEN: the struct's window_left/window_right hold the sliding window. Without it they are not
 * read and there is no window, so a zero-initialised struct (flags 0) means plain attention; with it,
 * (0, 0) is a window (the query's own key only) and -1 is "no limit". Other bits must be 0. */
enum { CAD_WINDOW_GIVEN = 1u << 0 };

/* ------------------------------------------------------------------------------------------------ */
/* Tensors: binary-compatible with DLPack's DLTensor (v0.8+), so hosts can pass DLPack tensors as-is.   */
/* ------------------------------------------------------------------------------------------------ */
typedef int32_t cad_device_type_t; /* values equal DLPack's DLDeviceType */
enum { CAD_DEVICE_CPU = 1, CAD_DEVICE_CUDA = 2 };

typedef struct cad_device_v1 {
  cad_device_type_t device_type; /* CAD_DEVICE_CPU or CAD_DEVICE_CUDA                              */
  int32_t device_id;             /* device ordinal; 0 for CPU                                       */
} cad_device_v1_t;

typedef uint8_t cad_dtype_code_t; /* values equal DLPack's DLDataTypeCode */
enum { CAD_DTYPE_CODE_INT = 0, CAD_DTYPE_CODE_UINT = 1, CAD_DTYPE_CODE_FLOAT = 2, CAD_DTYPE_CODE_BFLOAT = 4 };

typedef struct cad_dtype_v1 {
  uint8_t code;   /* cad_dtype_code_t                                                               */
  uint8_t bits;   /* 32 for fp32, 16 for bf16                                                        */
  uint16_t lanes; /* always 1 in this ABI                                                            */
} cad_dtype_v1_t;

/* A borrowed view of memory. Same layout as DLTensor: a host may cast a DLTensor* to this type.
 * `strides` is in elements; NULL means compact row-major. Data address is data + byte_offset. */
typedef struct cad_tensor_v1 {
  void* data;
  cad_device_v1_t device;
  int32_t ndim;
  cad_dtype_v1_t dtype;
  int64_t* shape;   /* ndim entries                                                                   */
  int64_t* strides; /* ndim entries, in elements, or NULL for compact row-major                      */
  uint64_t byte_offset;
} cad_tensor_v1_t;

/* ------------------------------------------------------------------------------------------------ */
/* Documents: pieces (what a rank holds) and tasks (what a server computes). See DESIGN.md.            */
/* ------------------------------------------------------------------------------------------------ */

/* A contiguous run of one document's tokens held by one rank: tokens [offset_in_doc, offset_in_doc+len)
 * of document doc_id, whose full length is doc_len. doc_id is unique across all ranks of one step. */
typedef struct cad_piece_v1 {
  int64_t doc_id;
  int64_t doc_len;
  int64_t offset_in_doc;
  int64_t len;
} cad_piece_v1_t;

/* One CA-task: queries [q_begin, q_end) of doc_id, computed on `server`, attending to keys [0, q_end)
 * (causal, bottom-right aligned) or [0, doc_len) (non-causal). */
typedef struct cad_task_v1 {
  int64_t doc_id;
  int64_t q_begin;
  int64_t q_end;
  int32_t server;
  int32_t reserved; /* must be 0 */
} cad_task_v1_t;

/* One segment of a server batch (varlen attention). Queries are rows [q_offset, q_offset+q_len) of Q
 * and attend to rows [kv_offset, kv_offset+kv_len) of K/V. Segments never overlap in Q but may overlap
 * (share) in K/V. Causal masks are aligned bottom-right: query i of the segment (0-based) sees keys
 * j <= i + (kv_len - q_len); q_len <= kv_len is required when causal. */
typedef struct cad_segment_v1 {
  int64_t q_offset;
  int64_t q_len;
  int64_t kv_offset;
  int64_t kv_len;
} cad_segment_v1_t;

/* ------------------------------------------------------------------------------------------------ */
/* Host services: what the host lends every plugin instance at create.                                 */
/* The table and its host_ctx must outlive every instance created with it.                             */
/* ------------------------------------------------------------------------------------------------ */
typedef int32_t cad_log_level_t;
enum {
  CAD_LOG_TRACE = 0,
  CAD_LOG_DEBUG = 1,
  CAD_LOG_INFO = 2,
  CAD_LOG_WARN = 3,
  CAD_LOG_ERROR = 4,
  CAD_LOG_OFF = 5
};

typedef int32_t cad_plugin_kind_t;
enum { CAD_PLUGIN_KIND_ATTENTION = 1, CAD_PLUGIN_KIND_COMMUNICATOR = 2, CAD_PLUGIN_KIND_BALANCER = 3 };

typedef struct cad_host_services_v1 {
  size_t struct_size;     /* sizeof(cad_host_services_v1_t) as the host knows it                    */
  uint32_t abi_major;     /* CAD_ABI_VERSION_MAJOR of the host                                       */
  uint32_t abi_minor;     /* CAD_ABI_VERSION_MINOR of the host                                       */
  void* host_ctx;         /* opaque; passed back as the first argument of every service               */
  cad_log_level_t log_level; /* the least severe level the host will print; plugins may skip below it */

  /* Log one line. `source` names the plugin instance. Thread-safe; may be called from any thread.    */
  void (*log)(void* host_ctx, cad_log_level_t level, const char* source, const char* message);

  /* Allocate `bytes` on `device` (aligned to at least 256 bytes). For CUDA the memory is usable in
   * stream order on `stream` (may be NULL). On success *out is owned by the caller until it is handed
   * back with `free` (same device and stream). Thread-safe. bytes == 0 yields *out == NULL and OK. */
  cad_status_t (*allocate)(void* host_ctx, cad_device_v1_t device, size_t bytes, void* stream, void** out);
  void (*free)(void* host_ctx, cad_device_v1_t device, void* ptr, void* stream);

  /* Find another plugin instance that the host created, by the instance name used in the host's
   * config. On success *out_table is that plugin's kind table (cad_attention_v1_t*, cad_communicator_v1_t*
   * or cad_balancer_v1_t*, per `kind`) and *out_instance its context; both are borrowed and stay valid
   * until the caller's own instance is destroyed (the host destroys instances in reverse creation
   * order). Returns CAD_STATUS_NOT_FOUND if no instance of that name and kind exists. Thread-safe. */
  cad_status_t (*lookup_plugin)(void* host_ctx, const char* instance_name, cad_plugin_kind_t kind,
                                const void** out_table, void** out_instance);

  /* Optional (may be NULL): an out-of-band all-gather among the host's ranks, used to bootstrap
   * communicators (e.g. exchange an NCCL unique id). Every rank passes `bytes` bytes in `send`;
   * `recv` receives world_size * bytes, ordered by rank. Blocking, collective, CPU memory only. */
  cad_status_t (*bootstrap_all_gather)(void* host_ctx, const void* send, size_t bytes, void* recv);
  int32_t bootstrap_rank;       /* this process's rank for bootstrap_all_gather, or -1             */
  int32_t bootstrap_world_size; /* number of ranks for bootstrap_all_gather, or 0                  */

  /* ---- ABI v1.1: optional host collectives (NULL, or beyond a v1.0 host's struct_size) ----
   * The host's own collectives on CPU memory among the bootstrap_rank / bootstrap_world_size ranks
   * (e.g. torch.distributed over gloo), for a communicator plugin that forwards to them (plugin "host"),
   * so that CAD runs under a launcher without MPI. A host lends all three or none. Same semantics as
   * the communicator calls of the same name (cad_communicator_v1.h: bytes, world_size entries per
   * array, rank order); collective over every rank, blocking, CPU memory only, no stream. Each returns
   * CAD_STATUS_TIMEOUT when the collective did not complete within `timeout_ms` (the host may apply a
   * shorter deadline of its own), never hangs, and on failure writes a NUL-terminated message into
   * `error` (capacity `error_capacity`). Called from the thread that called the plugin. */
  cad_status_t (*host_all_to_all_v)(void* host_ctx, const void* send, const uint64_t* send_counts,
                                    const uint64_t* send_displs, void* recv, const uint64_t* recv_counts,
                                    const uint64_t* recv_displs, int64_t timeout_ms, char* error,
                                    size_t error_capacity);
  cad_status_t (*host_all_gather)(void* host_ctx, const void* send, uint64_t bytes, void* recv, int64_t timeout_ms,
                                  char* error, size_t error_capacity);
  cad_status_t (*host_barrier)(void* host_ctx, int64_t timeout_ms, char* error, size_t error_capacity);
} cad_host_services_v1_t;

/* The size of cad_host_services_v1_t as ABI v1.0 defined it: a v1.1 plugin accepts a v1.0 host's table
 * (and reads no v1.1 field from it). */
#define CAD_HOST_SERVICES_V1_0_SIZE 80

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_COMMON_V1_H */
