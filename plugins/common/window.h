// window.h -- the ABI v1.2 sliding window of attention args and cost params: read only when the caller's
// struct has it and window_flags has CAD_WINDOW_GIVEN, checked once here so every backend refuses the same
// inputs with the same words.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cad_attention_v1.h"
#include "cad_balancer_v1.h"

#include "plugin_support.h"

namespace cad::plugin {

// window_size as PyTorch means it: keys [p - left, p + right] around the query's key position p; -1 = no
// limit. Causal windows are kept with right = -1: with the causal mask a right limit of 0 changes nothing,
// so (-1, 0) and (-1, -1) are the same plain causal attention.
struct Window {
  int64_t left = -1;
  int64_t right = -1;
  bool finite() const { return left >= 0 || right >= 0; }
  bool operator==(const Window& o) const { return left == o.left && right == o.right; }
  bool operator!=(const Window& o) const { return !(*this == o); }
};

// Checks a window given by a caller (`where` names the call) and normalises it as above.
inline Window check_window(int64_t left, int64_t right, bool causal, const char* where) {
  if (left < -1) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: window_left must be -1 (no limit) or >= 0, got %lld",
                                                          where, static_cast<long long>(left)));
  if (right < -1) fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: window_right must be -1 (no limit) or >= 0, got %lld",
                                                           where, static_cast<long long>(right)));
  if (causal && right > 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: window_right must be -1 or 0 when causal (a causal query sees no "
                                             "key after its own), got %lld", where, static_cast<long long>(right)));
  }
  return Window{left, causal ? -1 : right};
}

// The names of the structs that carry the ABI v1.2 window, for the refusals below.
inline const char* window_struct_name(const cad_attention_forward_args_v1_t*) { return "cad_attention_forward_args_v1_t"; }
inline const char* window_struct_name(const cad_attention_backward_args_v1_t*) { return "cad_attention_backward_args_v1_t"; }
inline const char* window_struct_name(const cad_attention_plan_args_v1_t*) { return "cad_attention_plan_args_v1_t"; }
inline const char* window_struct_name(const cad_cost_params_v1_t*) { return "cad_cost_params_v1_t"; }

// Does a struct with the ABI v1.2 window (forward/backward/plan args, cost params) give one? Not when the
// caller's struct predates v1.2 (struct_size ends before window_flags), nor when window_flags lacks
// CAD_WINDOW_GIVEN: a zero-initialised struct means no window, whatever window_left/right hold. A struct
// that holds window_flags with CAD_WINDOW_GIVEN but ends before window_right is refused (ABI_MISMATCH,
// naming the struct and its size): the flag promises fields the caller did not pass, and running without
// the window would compute other attention with OK. Unknown flag bits and a nonzero reserved_v1_2 are
// refused (`where` names the call), so they stay free for later versions.
template <class Args>
bool window_given(const Args* args, const char* where) {
  if (!CAD_HAS_FIELD(Args, args, window_flags)) return false;
  if ((args->window_flags & ~static_cast<uint32_t>(CAD_WINDOW_GIVEN)) != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: window_flags = 0x%x has bits other than CAD_WINDOW_GIVEN",
                                             where, static_cast<unsigned>(args->window_flags)));
  }
  if (CAD_HAS_FIELD(Args, args, reserved_v1_2) && args->reserved_v1_2 != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("%s: reserved_v1_2 must be 0", where));
  }
  if ((args->window_flags & CAD_WINDOW_GIVEN) == 0) return false;
  if (!CAD_HAS_FIELD(Args, args, window_right)) {
    fail(CAD_STATUS_ABI_MISMATCH,
         format("%s: window_flags has CAD_WINDOW_GIVEN but %s.struct_size is %zu, which does not hold "
                "window_left and window_right (they need struct_size >= %zu)",
                where, window_struct_name(args), args->struct_size,
                offsetof(Args, window_right) + sizeof(args->window_right)));
  }
  return true;
}

// The window of forward/backward/plan args: none unless window_given.
template <class Args>
Window read_window(const Args* args, bool causal, const char* where) {
  if (!window_given(args, where)) return Window{};
  return check_window(args->window_left, args->window_right, causal, where);
}

// For a backend without CAD_ATTENTION_CAP_WINDOW: refuse a finite window instead of ignoring it.
inline void refuse_window(const Window& window, const char* backend, const char* where) {
  if (!window.finite()) return;
  fail(CAD_STATUS_UNSUPPORTED, format("%s: the %s backend does not compute sliding windows (window_left=%lld, "
                                      "window_right=%lld); use one that reports CAD_ATTENTION_CAP_WINDOW",
                                      where, backend, static_cast<long long>(window.left),
                                      static_cast<long long>(window.right)));
}

}  // namespace cad::plugin
