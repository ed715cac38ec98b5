// pack_gpu_test.cpp -- the pack/unpack row-range copies and the fixed-order partial sums of
// plugins/cad/pack.h against host computations on random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "pack.h"
#include "gpu_harness.h"

namespace cad::gpu_test {
namespace {

using kernels::RowCopy;

// Random disjoint ranges of a [T, row] tensor, packed back to back (pack), in a shuffled order.
std::vector<RowCopy> random_ranges(std::mt19937_64& rng, int64_t rows, int64_t* packed_rows) {
  std::vector<RowCopy> copies;
  int64_t at = 0;
  while (at < rows) {
    const int64_t len = std::min<int64_t>(rows - at, std::uniform_int_distribution<int64_t>(1, 300)(rng));
    if (std::uniform_int_distribution<int>(0, 3)(rng) != 0) copies.push_back({at, 0, len});  // some rows stay home
    at += len;
  }
  std::shuffle(copies.begin(), copies.end(), rng);
  int64_t dst = 0;
  for (RowCopy& c : copies) {
    c.dst_row = dst;
    dst += c.num_rows;
  }
  *packed_rows = dst;
  return copies;
}

// Rows packed back to back (pack) and unpacked into a zeroed tensor (the same ranges, source and destination
// swapped): whole rows (slice == full: copy_row_ranges) or a head group's slice of every row (`slice` bytes at
// `offset` of `full`-byte rows: copy_row_slices). What was copied lands where it came from, every other byte stays 0.
void round_trip(int64_t full, int64_t slice, int64_t offset, int64_t byte_shift) {
  std::mt19937_64 rng(static_cast<uint64_t>(full * 7 + slice * 3 + offset));
  const int64_t rows = 3000;
  int64_t packed_rows = 0;
  const std::vector<RowCopy> copies = random_ranges(rng, rows, &packed_rows);
  std::vector<unsigned char> src(static_cast<size_t>(rows * full));
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  DeviceBuffer d_src(src.size() + 16), d_packed(static_cast<size_t>(packed_rows * slice) + 16), d_back(src.size() + 16),
      d_copies(copies.size() * sizeof(RowCopy));
  char* s = static_cast<char*>(d_src.get()) + byte_shift;
  char* pk = static_cast<char*>(d_packed.get()) + byte_shift;
  char* bk = static_cast<char*>(d_back.get()) + byte_shift;
  cudaMemcpy(s, src.data(), src.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_copies.get(), copies.data(), d_copies.bytes(), cudaMemcpyHostToDevice);
  cudaMemset(bk, 0, src.size());
  const int64_t n = static_cast<int64_t>(copies.size());
  std::vector<RowCopy> reverse = copies;
  for (RowCopy& c : reverse) std::swap(c.src_row, c.dst_row);
  DeviceBuffer d_reverse(reverse.size() * sizeof(RowCopy));
  cudaMemcpy(d_reverse.get(), reverse.data(), d_reverse.bytes(), cudaMemcpyHostToDevice);
  const auto* forth = static_cast<const RowCopy*>(d_copies.get());
  const auto* back_copies = static_cast<const RowCopy*>(d_reverse.get());
  if (slice == full) {
    ASSERT_EQ(kernels::copy_row_ranges(s, pk, full, forth, n, nullptr), cudaSuccess);
    ASSERT_EQ(kernels::copy_row_ranges(pk, bk, full, back_copies, n, nullptr), cudaSuccess);
  } else {
    ASSERT_EQ(kernels::copy_row_slices(s + offset, full, pk, slice, slice, forth, n, nullptr), cudaSuccess);
    ASSERT_EQ(kernels::copy_row_slices(pk, slice, bk + offset, full, slice, back_copies, n, nullptr), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<unsigned char> packed(static_cast<size_t>(packed_rows * slice)), back(src.size());
  cudaMemcpy(packed.data(), pk, packed.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(back.data(), bk, back.size(), cudaMemcpyDeviceToHost);
  std::vector<unsigned char> want_packed(packed.size()), want_back(src.size(), 0);
  for (const RowCopy& c : copies) {
    for (int64_t r = 0; r < c.num_rows; ++r) {
      const auto from = src.begin() + (c.src_row + r) * full + offset;
      std::copy(from, from + slice, want_packed.begin() + (c.dst_row + r) * slice);
      std::copy(from, from + slice, want_back.begin() + (c.src_row + r) * full + offset);
    }
  }
  EXPECT_EQ(packed, want_packed);
  EXPECT_EQ(back, want_back);
}

TEST(GpuPack, RoundTripWide) { round_trip(8 * 128 * 2, 8 * 128 * 2, 0, 0); }  // [T, 8, 128] bf16 rows: 16-byte path
TEST(GpuPack, RoundTripWordAligned) { round_trip(36, 36, 0, 4); }             // 4-byte path
TEST(GpuPack, RoundTripUnaligned) { round_trip(7, 7, 0, 1); }                 // byte path
TEST(GpuPack, SlicesWide) { round_trip(8 * 128 * 2, 2 * 128 * 2, 4 * 128 * 2, 0); }  // heads 4-5 of 8: 16 bytes
TEST(GpuPack, SlicesWordAligned) { round_trip(36, 12, 12, 4); }                     // 4-byte path
TEST(GpuPack, SlicesUnaligned) { round_trip(21, 7, 7, 1); }                         // byte path
TEST(GpuPack, SlicesRefuseAStrideShorterThanTheSlice) {
  EXPECT_EQ(kernels::copy_row_slices(reinterpret_cast<void*>(16), 8, reinterpret_cast<void*>(32), 16, 12,
                                     reinterpret_cast<const RowCopy*>(64), 1, nullptr),
            cudaErrorInvalidValue);
}

// The dK/dV sum into a head group's slice of each owner row (out_row_stride): only the slice is written.
TEST(GpuPack, SumRowsIntoASliceOfEachRow) {
  const int64_t elems = 6, stride = 18, offset = 6;  // the middle third of 18-element rows
  const std::vector<float> src = [&] {
    std::vector<float> v(static_cast<size_t>(4 * elems));
    std::iota(v.begin(), v.end(), 1.0f);
    return v;
  }();
  // Owner rows 2 and 0: row 2 = src rows 3 + 1, row 0 = src row 0.
  const std::vector<int64_t> first = {0, 2, 3}, src_rows = {3, 1, 0}, owner_rows = {2, 0};
  std::vector<float> out(static_cast<size_t>(3 * stride), -1.0f);
  DeviceBuffer d_src(src.size() * 4), d_first(first.size() * 8), d_rows(src_rows.size() * 8),
      d_owner(owner_rows.size() * 8), d_out(out.size() * 4);
  cudaMemcpy(d_src.get(), src.data(), d_src.bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_first.get(), first.data(), d_first.bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_rows.get(), src_rows.data(), d_rows.bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_owner.get(), owner_rows.data(), d_owner.bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_out.get(), out.data(), d_out.bytes(), cudaMemcpyHostToDevice);
  ASSERT_EQ(kernels::sum_rows(d_src.get(), false, elems, static_cast<const int64_t*>(d_first.get()),
                              static_cast<const int64_t*>(d_rows.get()), static_cast<const int64_t*>(d_owner.get()), 2,
                              static_cast<float*>(d_out.get()) + offset, nullptr, false, stride),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaMemcpy(out.data(), d_out.get(), d_out.bytes(), cudaMemcpyDeviceToHost);
  for (int64_t row = 0; row < 3; ++row) {
    for (int64_t e = 0; e < stride; ++e) {
      float want = -1.0f;  // untouched
      if (e >= offset && e < offset + elems) {
        const int64_t k = e - offset;
        if (row == 2) want = src[static_cast<size_t>(3 * elems + k)] + src[static_cast<size_t>(1 * elems + k)];
        if (row == 0) want = src[static_cast<size_t>(k)];
      }
      EXPECT_EQ(out[static_cast<size_t>(row * stride + e)], want) << "row " << row << " element " << e;
    }
  }
}

TEST(GpuPack, SumPartialsInFixedOrder) {
  std::mt19937_64 rng(9);
  const int parts = 5;
  const int64_t n = 100003, stride = 100096;
  std::vector<float> f32;
  const auto bf = random_bf16(static_cast<size_t>(parts * stride), rng, &f32);
  std::vector<float> start_f;
  const auto start = random_bf16(static_cast<size_t>(n), rng, &start_f);

  DeviceBuffer d_parts(bf.size() * 2), d_out(static_cast<size_t>(n) * 2), d_parts32(f32.size() * 4),
      d_out32(static_cast<size_t>(n) * 4);
  cudaMemcpy(d_parts.get(), bf.data(), d_parts.bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_out.get(), start.data(), d_out.bytes(), cudaMemcpyHostToDevice);
  cudaMemcpy(d_parts32.get(), f32.data(), d_parts32.bytes(), cudaMemcpyHostToDevice);
  ASSERT_EQ(kernels::sum_partials_bf16(d_parts.get(), parts, stride, n, d_out.get(), true, nullptr), cudaSuccess);
  ASSERT_EQ(kernels::sum_partials_f32(static_cast<const float*>(d_parts32.get()), parts, stride, n,
                                      static_cast<float*>(d_out32.get()), false, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> out(static_cast<size_t>(n));
  std::vector<float> out32(static_cast<size_t>(n));
  cudaMemcpy(out.data(), d_out.get(), d_out.bytes(), cudaMemcpyDeviceToHost);
  cudaMemcpy(out32.data(), d_out32.get(), d_out32.bytes(), cudaMemcpyDeviceToHost);
  for (int64_t i = 0; i < n; ++i) {
    float acc = start_f[static_cast<size_t>(i)], acc32 = 0.f;
    for (int p = 0; p < parts; ++p) {
      acc += f32[static_cast<size_t>(p * stride + i)];
      acc32 += f32[static_cast<size_t>(p * stride + i)];
    }
    ASSERT_EQ(out[static_cast<size_t>(i)], float_to_bf16(acc)) << "element " << i;
    ASSERT_EQ(out32[static_cast<size_t>(i)], acc32) << "element " << i;  // same order, same fp32 rounding
  }
}

}  // namespace
}  // namespace cad::gpu_test
