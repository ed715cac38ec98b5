// plan_limits.h -- what the int64 cost and traffic model (plan_model.h) can represent.
//
// The model counts score entries and bytes in int64. A causal document of L tokens costs L(L+1)/2
// entries, so a single document of 2^32 tokens already needs 2^63: without a check, costs wrap to
// negative values and every balancer and report built on them is garbage. Callers (the balancers'
// input check, `cad plan`) ask here first and refuse, with this message, what does not fit.
#pragma once

#include <cstdint>
#include <string>

#include "plan_model.h"

namespace cad::plan {

// The largest total the model lets a plan reach (cost in score entries, or bytes): half of INT64_MAX,
// so that a balancer may add one more task's cost or bytes to any partial sum without overflow.
constexpr int64_t kModelLimit = INT64_MAX / 2;

// Empty when every cost and byte count of any plan over these pieces on `num_servers` servers fits
// below kModelLimit; otherwise a message saying which quantity does not fit and by how much. Upper
// bounds: cost <= sum over documents of L(L+1)/2 (causal) or L^2; bytes <= every query row shipped
// out and back plus every document's KV shipped to min(num_servers, L) servers. Pieces are read as
// given (their doc_len is trusted to have been checked, or is checked by the caller afterwards).
std::string model_overflow(const RankPieces& ranks, int32_t num_servers, const ModelParams& params);

}  // namespace cad::plan
