// bf16_test.cpp -- the oracle's fp32 -> bf16 rounding (bf16.h, used for every bf16 output) against
// the tests' own round-to-nearest-even, on edge cases and random bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "bf16.h"
#include "host_tensor.h"

namespace cad::testing {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

TEST(ReferenceBf16, TiesRoundToEven) {
  EXPECT_EQ(cad::reference::float_to_bf16(from_bits(0x3f808000u)), 0x3f80u);  // tie, even below
  EXPECT_EQ(cad::reference::float_to_bf16(from_bits(0x3f818000u)), 0x3f82u);  // tie, even above
  EXPECT_EQ(cad::reference::float_to_bf16(from_bits(0x3f808001u)), 0x3f81u);  // just above the tie
  EXPECT_EQ(cad::reference::float_to_bf16(from_bits(0x3f807fffu)), 0x3f80u);  // just below the tie
}

TEST(ReferenceBf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cad::reference::float_to_bf16(inf), 0x7f80u);
  EXPECT_EQ(cad::reference::float_to_bf16(-inf), 0xff80u);
  EXPECT_EQ(cad::reference::float_to_bf16(-0.0f), 0x8000u);
  EXPECT_TRUE(std::isnan(cad::reference::bf16_to_float(cad::reference::float_to_bf16(std::nanf("")))));
  // A NaN whose payload lies only in the dropped bits must stay a NaN, not become infinity.
  EXPECT_TRUE(std::isnan(cad::reference::bf16_to_float(cad::reference::float_to_bf16(from_bits(0x7f800001u)))));
  // The largest finite floats round up to infinity, as round-to-nearest demands.
  EXPECT_EQ(cad::reference::float_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);
}

TEST(ReferenceBf16, MatchesIndependentRounding) {
  std::mt19937 rng(2024);
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    const uint16_t want = bf16_bits(round_to_bf16(x));
    ASSERT_EQ(cad::reference::float_to_bf16(x), want) << "x = " << x;
    EXPECT_EQ(cad::reference::bf16_to_float(want), round_to_bf16(x));
  }
}

}  // namespace
}  // namespace cad::testing
