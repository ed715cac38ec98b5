// validate.h -- the checks CAD runs before it moves any data:
//  - local: one rank's arguments (pointers, tensors against its own piece table, dtypes, heads);
//  - global: the piece tables of all ranks (gaps, overlaps, disagreeing doc_len) and the plan.
// Every check throws plugin::Failure with a message naming the rank, piece, document or tensor.
// The global checks are pure functions of data every rank holds identically, so every rank reaches
// the same verdict and the same message.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cad_attention_v1.h"
#include "cad_balancer_v1.h"
#include "layout.h"

namespace cad::cad_plugin {

// The shape of one rank's call, as its tensors describe it.
struct CallShape {
  int64_t tokens = 0;  // sum of the local pieces' lengths = rows of q, k, v, ...
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  bool bf16 = false;  // else fp32
  bool causal = true;
  int64_t window_left = -1;  // sliding window (ABI v1.2), causal only in CAD; -1 = none
  float softmax_scale = 0.0f;
  cad_device_type_t device_type = CAD_DEVICE_CPU;  // of every tensor of the call
  int32_t device_id = 0;

  int64_t element_bytes() const { return bf16 ? 2 : 4; }
  int64_t q_row_bytes() const { return int64_t{num_q_heads} * head_dim * element_bytes(); }
  int64_t kv_row_bytes() const { return int64_t{num_kv_heads} * head_dim * element_bytes(); }
};

// What the server backend (and so CAD) accepts; taken from its capabilities at create.
struct Accepts {
  cad_device_type_t device_type = CAD_DEVICE_CPU;  // where the server backend, and so CAD's tensors, live
  uint32_t dtype_mask = 0;
  uint32_t flags = 0;
  int32_t max_head_dim = 0;
};

// Local checks of a forward / backward call. Return the call's shape; throw INVALID_ARGUMENT or
// UNSUPPORTED naming the argument. `plan_tokens` is the plan's token count when the call has a plan
// (its pieces may then be omitted), else -1.
CallShape check_forward_args(const cad_attention_forward_args_v1_t* args, const Accepts& accepts,
                             int64_t plan_tokens = -1);
CallShape check_backward_args(const cad_attention_backward_args_v1_t* args, const Accepts& accepts,
                              int64_t plan_tokens = -1);

// make_plan's arguments: the shape every call made with the plan will have (softmax_scale 0).
CallShape check_plan_args(const cad_attention_plan_args_v1_t* args, const Accepts& accepts);

// The other way round: the server backend's make_plan args of a server batch of calls of `shape` (segments
// point into `batch`, which must outlive the args).
cad_attention_plan_args_v1_t server_plan_args(const ServerBatch& batch, const CallShape& shape, void* stream);

// One of `groups` head groups of a call: Hq / groups query heads over Hkv / groups key/value heads (a query
// head keeps its key/value head, GQA's groups being consecutive). Throws INVALID_CONFIG naming the config key
// where `groups` does not divide both.
CallShape head_group_shape(const CallShape& shape, int32_t groups);

// The pieces of every rank must tile each document [0, doc_len) exactly once, with one doc_len per
// document and lengths >= 1. Throws INVALID_ARGUMENT naming the rank, piece and document.
void check_piece_tables(const PieceTables& tables);

// The plan must cover each document of `tables` exactly once with tasks on servers [0, world).
// Throws INTERNAL naming the balancer instance (a plan that breaks the invariant is its bug).
void check_plan(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks, int32_t world,
                const std::string& balancer_name);

}  // namespace cad::cad_plugin
