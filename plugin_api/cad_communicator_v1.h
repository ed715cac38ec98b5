/*
 * cad_communicator_v1.h -- the communicator plugin kind, ABI major version 1. FROZEN (see
 * cad_common_v1.h for the conventions every function follows).
 *
 * A communicator connects the ranks of one group. Data calls are collective: every rank of the group
 * must make the same sequence of calls. They move raw bytes; counts and displacements are in bytes.
 * Buffers live on the communicator's device (CPU memory for MPI, CUDA memory for NCCL).
 *
 * Streams: a data call takes `stream` (cudaStream_t, or NULL for CPU communicators) and only enqueues
 * the transfer on it; the caller synchronises before reading `recv`. CPU communicators complete the
 * transfer before returning.
 *
 * Failures: a mismatch between ranks, a peer that died or a transfer that outlives the configured
 * timeout returns CAD_STATUS_COMMUNICATION or CAD_STATUS_TIMEOUT instead of hanging; after such an
 * error the instance is unusable except for last_error and destroy.
 *
 * Threading: calls on one context must not overlap; different contexts are independent.
 */
#ifndef CAD_COMMUNICATOR_V1_H
#define CAD_COMMUNICATOR_V1_H

#include "cad_common_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cad_communicator_v1 {
  size_t struct_size; /* sizeof(cad_communicator_v1_t) as the plugin was built */

  /* Same contract as cad_attention_v1_t::create. Creating a communicator is collective over its
   * group (it may bootstrap through services->bootstrap_all_gather). */
  cad_status_t (*create)(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                         char* error_message, size_t error_capacity);
  void (*destroy)(void* ctx);
  const char* (*last_error)(void* ctx);

  /* This rank's index in [0, world_size) and the group's size. Never fail on a live instance. */
  cad_status_t (*get_rank)(void* ctx, int32_t* out_rank);
  cad_status_t (*get_world_size)(void* ctx, int32_t* out_world_size);
  /* Where data buffers must live for this instance. */
  cad_status_t (*get_device)(void* ctx, cad_device_v1_t* out_device);

  /* Personalised all-to-all. send_counts[p] bytes at send + send_displs[p] go to rank p, and
   * recv_counts[p] bytes from rank p land at recv + recv_displs[p]. All four arrays have world_size
   * entries. recv_counts[p] on this rank must equal send_counts[this rank] on rank p (a mismatch is
   * an error, not undefined behaviour, where the transport can detect it). Zero counts are allowed and
   * a rank sends to itself too. send and recv must not overlap. */
  cad_status_t (*all_to_all_v)(void* ctx, const void* send, const uint64_t* send_counts,
                               const uint64_t* send_displs, void* recv, const uint64_t* recv_counts,
                               const uint64_t* recv_displs, void* stream);

  /* Every rank contributes `bytes` bytes from `send`; recv receives world_size * bytes, by rank. */
  cad_status_t (*all_gather)(void* ctx, const void* send, uint64_t bytes, void* recv, void* stream);

  /* Returns once every rank has entered the barrier (CPU); for stream communicators it enqueues a
   * barrier-equivalent on `stream`. */
  cad_status_t (*barrier)(void* ctx, void* stream);
} cad_communicator_v1_t;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_COMMUNICATOR_V1_H */
