// validate.h -- the checks CAD runs before it moves any data:
//  - local: make_plan's arguments (pieces, dtypes, heads, mask against the server backend), and the parts of them
//    a call without a plan shares; a forward/backward call's arguments are checked in call_check.h;
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
#include "plugin_support.h"
#include "window.h"

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

// The checks make_plan and a call without a plan share (call_check.h checks a call; a call with a plan is compared
// with what make_plan checked here, never checked against the backend again). Each throws naming the argument.
// Pieces: non-negative lengths whose sum (returned) is the number of local tokens; everything else about them
// (gaps, overlaps, doc_len) is checked globally, where the whole table is known (check_piece_tables).
int64_t count_tokens(const cad_piece_v1_t* pieces, int64_t num_pieces);
// The dtypes the server backend computes.
std::vector<plugin::DType> accepted_dtypes(const Accepts& accepts);
// The causal flag: 0 or 1, and supported by the server backend.
void check_causal(int32_t causal, const Accepts& accepts);
// Heads and head dim against each other and the server backend.
void check_heads(int64_t hq, int64_t hkv, int64_t d, const Accepts& accepts);
// A sliding window against what CAD and its server backend compute; returns window_left (-1: none). CAD computes
// causal windows only: a task's queries [q_begin, q_end) then read the keys [q_begin - left, q_end) of their
// document, and the bottom-right alignment of the server's segments puts every query at its document position.
// A non-causal window would need keys after q_end, where that alignment no longer holds.
int64_t check_window(const plugin::Window& window, int32_t causal, const Accepts& accepts);

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
