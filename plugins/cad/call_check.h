// call_check.h -- the one check of a forward or backward call's arguments: the place where CAD decides whether
// "these tensors match this plan" (or, for a call without a plan, whether they match the call's own pieces).
//
// With a plan, what the plan fixed when it was made (make_plan checked the pieces of every rank, the mask against
// the server backend, heads and dtype against its capabilities) is not validated again. The call's struct still
// carries those fields (ABI v1 stays as it is), and the rule for each is:
//   - pieces / num_pieces: may be omitted (num_pieces 0). Given, they are compared with the plan's pieces as one
//     block of bytes (a memcmp, not a field-by-field check): other pieces are refused as another micro-batch's.
//   - causal, window: compared with the plan's (two integers); another mask is refused naming the field.
//   - heads, head dim, dtype, tokens, device: the tensors must have exactly the plan's; each tensor is checked
//     once against the plan's shape (its rank, extents, dtype, compact strides, device, and that its bytes are
//     addressable), a refusal naming the struct's tensor, the dim and the plan.
//   - softmax_scale and stream: per call, so checked per call.
// The stream's device (a CUDA query) is checked by the caller beside this (device_path.h: check_call_stream).
// Every check throws plugin::Failure with a message that starts with the call ("forward", "backward").
#pragma once

#include <cstdint>
#include <vector>

#include "cad_attention_v1.h"
#include "handles.h"
#include "validate.h"

namespace cad::cad_plugin {

// One call's arguments as the host passed them, whichever direction: exactly one of the two pointers is the
// call's (and may be NULL, which the check refuses). The call path of both directions (call.h) reads them here.
struct CallArgs {
  CallKind kind = kForward;
  const cad_attention_forward_args_v1_t* forward = nullptr;
  const cad_attention_backward_args_v1_t* backward = nullptr;

  static CallArgs of(const cad_attention_forward_args_v1_t* args) { return {kForward, args, nullptr}; }
  static CallArgs of(const cad_attention_backward_args_v1_t* args) { return {kBackward, nullptr, args}; }

  const char* what() const { return kind == kForward ? "forward" : "backward"; }
  bool null() const { return kind == kForward ? forward == nullptr : backward == nullptr; }
  // The struct holds the ABI v1.1 fields (plan, saved).
  bool v11() const {
    return kind == kForward ? forward != nullptr && CAD_HAS_FIELD(cad_attention_forward_args_v1_t, forward, saved)
                            : backward != nullptr && CAD_HAS_FIELD(cad_attention_backward_args_v1_t, backward, saved);
  }
  void* plan() const { return !v11() ? nullptr : kind == kForward ? forward->plan : backward->plan; }
  void* stream() const {
    return null() ? nullptr : kind == kForward ? forward->stream : backward->stream;
  }
  const cad_piece_v1_t* pieces() const {
    return null() ? nullptr : kind == kForward ? forward->pieces : backward->pieces;
  }
  int64_t num_pieces() const { return null() ? 0 : kind == kForward ? forward->num_pieces : backward->num_pieces; }
};

// What a plan fixed, as the check compares it (a view of a CadPlan, plan.h; the unit tests build one directly).
struct PlanFixed {
  const CallShape& shape;                     // softmax_scale unset
  const std::vector<cad_piece_v1_t>& pieces;  // this rank's, as make_plan was given them
  uint64_t serial;                            // the plan's number, for messages ("plan #3")
};

// Checks `call` against `plan` (NULL: a call without a plan, checked against its own pieces and the server
// backend's capabilities `accepts`). Returns the call's shape: the plan's, with the call's softmax_scale.
// Throws INVALID_ARGUMENT, UNSUPPORTED or ABI_MISMATCH naming the struct, field or tensor.
CallShape check_call(const CallArgs& call, const Accepts& accepts, const PlanFixed* plan);

}  // namespace cad::cad_plugin
