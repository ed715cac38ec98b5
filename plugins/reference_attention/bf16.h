// bf16.h -- bfloat16 <-> fp32 conversion, as the reference backend defines it: a bf16 value is the
// upper 16 bits of an fp32; fp32 -> bf16 rounds to nearest, ties to even, and keeps NaN a NaN.
// Header-only so that tests and other backends can use exactly the oracle's rounding.
#pragma once

#include <cstdint>
#include <cstring>

namespace cad::reference {

inline float bf16_to_float(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline uint16_t float_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const bool is_nan = (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
  if (is_nan) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  // Adding 0x7fff plus the lowest kept bit rounds to nearest and breaks ties towards an even result;
  // a carry into the exponent is the correct rounding (up to infinity for the largest values).
  const uint32_t lowest_kept_bit = (bits >> 16) & 1u;
  bits += 0x7fffu + lowest_kept_bit;
  return static_cast<uint16_t>(bits >> 16);
}

inline void bf16_to_float(const uint16_t* in, float* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(in[i]);
}

inline void float_to_bf16(const float* in, uint16_t* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) out[i] = float_to_bf16(in[i]);
}

}  // namespace cad::reference
