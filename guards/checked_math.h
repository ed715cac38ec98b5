// checked_math.h -- overflow-proof arithmetic for every range and size check on the ABI boundary.
//
// A check written as `offset + len > extent` in int64 is itself undefined behaviour when a caller
// passes offset = INT64_MAX - 1 and len = 2: the sum wraps, the check passes, and the kernel writes
// outside the buffer. Every range check in the plugins goes through these helpers instead, which never
// compute a value that can overflow. Header-only, no dependencies: the plugins, the host adapter and
// the fuzzers all include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cad::checked {

// out = a + b / a * b; false (out unspecified) when the exact result does not fit.
inline bool add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }
inline bool mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
inline bool add(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
inline bool mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// [offset, offset + len) lies inside [0, extent): every value non-negative and offset + len <= extent.
// Never computes offset + len (extent - len cannot overflow once both are known non-negative).
inline bool range_within(int64_t offset, int64_t len, int64_t extent) {
  return offset >= 0 && len >= 0 && extent >= 0 && len <= extent && offset <= extent - len;
}

// The same for unsigned byte counts and displacements (all_to_all_v): displ + count <= extent.
inline bool range_within(uint64_t offset, uint64_t len, uint64_t extent) {
  return len <= extent && offset <= extent - len;
}

// offset + len does not overflow uint64 (a range with no known extent, e.g. a caller's buffer).
inline bool range_representable(uint64_t offset, uint64_t len) { return len <= UINT64_MAX - offset; }

// The size in bytes of a tensor of `n` extents: their product times `element_bytes`, when it fits in
// int64 (and so in ptrdiff_t on 64-bit hosts). False when an extent is negative or the product of the
// non-zero extents overflows -- also for an empty tensor, so that a caller may multiply partial
// products of the extents (strides) without overflow once this returned true.
inline bool product_bytes(const int64_t* extents, int n, int64_t element_bytes, int64_t* out) {
  if (element_bytes < 0) return false;
  int64_t total = element_bytes;
  bool empty = false;
  for (int i = 0; i < n; ++i) {
    if (extents[i] < 0) return false;
    if (extents[i] == 0) {
      empty = true;
    } else if (!mul(total, extents[i], &total)) {
      return false;
    }
  }
  *out = empty ? 0 : total;
  return true;
}

}  // namespace cad::checked
