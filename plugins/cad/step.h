// step.h -- the collective preamble of every CAD call: agree that every rank's call is valid and has
// the same shape, gather the piece tables, validate them, plan with the balancer and derive the
// layout. Every rank ends with the same Step, or every rank throws the same failure.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cad_balancer_v1.h"
#include "comm.h"
#include "handles.h"
#include "layout.h"
#include "validate.h"

namespace cad::cad_plugin {

// This rank's view of its call, before any communication.
struct LocalCall {
  cad_status_t status = CAD_STATUS_OK;  // the local checks' verdict
  std::string message;                  // why, if not OK
  CallShape shape;                      // valid only if status is OK
  int64_t num_pieces = 0;
  bool matches_last_forward = false;    // backward: same pieces and shape as the last forward
  CallTicket ticket;                    // compared across ranks wherever the call agrees on the host
  int32_t head_groups = 0;              // this rank's config (context.h), where the call may plan; else 0
};

// The agreed view of a call.
struct AgreedCall {
  CallShape shape;                  // identical on every rank, except `tokens` (this rank's)
  std::vector<int64_t> num_pieces;  // per rank
  int32_t first_rank_not_matching = -1;  // backward: lowest rank whose call differs from its last forward
};

// One all_gather. Throws on every rank if any rank's local checks failed (naming the lowest such
// rank) or if ranks disagree on heads, head dim, dtype, causal flag, softmax scale or their tickets.
AgreedCall agree_on_call(Comm& comm, const LocalCall& local, const char* what);

struct BalancerRef {
  const cad_balancer_v1_t* table = nullptr;
  void* instance = nullptr;
  std::string name;
};

// Knobs of the cost model that come from CAD's config.
struct PlanKnobs {
  int64_t min_shard_tokens = 0;
  int64_t memory_cap_bytes = 0;
};

struct Step {
  CallShape shape;
  PieceTables tables;
  std::vector<cad_task_v1_t> tasks;
  Layout layout;
  double plan_ms = 0.0;  // balancer time on this rank
};

// Gathers the tables, validates them, plans and lays out (`own_in_place`: build_layout's), then runs `finish`
// (rank-local preparation such as device buffers, may throw) and agrees on the outcome. Collective; same result
// on every rank, or the same failure on every rank.
Step prepare_step(Comm& comm, const BalancerRef& balancer, const AgreedCall& call, const cad_piece_v1_t* pieces,
                  const PlanKnobs& knobs, bool own_in_place, const std::function<void(Step&)>& finish = nullptr);

}  // namespace cad::cad_plugin
