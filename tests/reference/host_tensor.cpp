// host_tensor.cpp -- see host_tensor.h.
#include "host_tensor.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace cad::testing {

static float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float round_to_bf16(float x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  // The two bf16 values around x: x truncated towards zero, and the next one away from zero. Past
  // the largest bf16 the next one is 2^128, which only double can hold.
  const uint32_t truncated = bits_of(x) & 0xffff0000u;
  const float toward_zero = float_from_bits(truncated);
  const bool next_overflows = ((truncated + 0x10000u) & 0x7fffffffu) == 0x7f800000u;
  const double away = next_overflows ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(x))
                                     : static_cast<double>(float_from_bits(truncated + 0x10000u));
  const double gap_toward = std::fabs(static_cast<double>(x) - toward_zero);
  const double gap_away = std::fabs(away - x);
  const bool take_away = gap_away < gap_toward || (gap_away == gap_toward && ((truncated >> 16) & 1u) != 0);
  if (!take_away) return toward_zero;  // a tie goes to the even mantissa
  return next_overflows ? std::copysign(std::numeric_limits<float>::infinity(), x) : static_cast<float>(away);
}

uint16_t bf16_bits(float rounded) { return static_cast<uint16_t>(bits_of(rounded) >> 16); }

HostTensor::HostTensor(std::vector<int64_t> shape, Dtype dtype) : shape_(std::move(shape)), dtype_(dtype) {
  if (dtype_ == Dtype::F32) {
    f32_.assign(static_cast<size_t>(numel()), 0.0f);
  } else {
    bf16_.assign(static_cast<size_t>(numel()), 0);
  }
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t extent : shape_) n *= extent;
  return n;
}

float HostTensor::get(int64_t i) const {
  if (dtype_ == Dtype::F32) return f32_[static_cast<size_t>(i)];
  return float_from_bits(static_cast<uint32_t>(bf16_[static_cast<size_t>(i)]) << 16);
}

void HostTensor::set(int64_t i, float x) {
  if (dtype_ == Dtype::F32) {
    f32_[static_cast<size_t>(i)] = x;
  } else {
    bf16_[static_cast<size_t>(i)] = bf16_bits(round_to_bf16(x));
  }
}

void HostTensor::fill(float x) {
  for (int64_t i = 0; i < numel(); ++i) set(i, x);
}

void HostTensor::fill_uniform(std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < numel(); ++i) set(i, dist(rng));
}

std::vector<double> HostTensor::to_double() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = get(i);
  return out;
}

std::vector<uint8_t> HostTensor::bytes() const {
  const uint8_t* begin = dtype_ == Dtype::F32 ? reinterpret_cast<const uint8_t*>(f32_.data())
                                              : reinterpret_cast<const uint8_t*>(bf16_.data());
  const size_t size = dtype_ == Dtype::F32 ? f32_.size() * sizeof(float) : bf16_.size() * sizeof(uint16_t);
  return std::vector<uint8_t>(begin, begin + size);
}

cad_tensor_v1_t* HostTensor::view() {
  view_ = cad_tensor_v1_t{};
  view_.data = dtype_ == Dtype::F32 ? static_cast<void*>(f32_.data()) : static_cast<void*>(bf16_.data());
  view_.device = {CAD_DEVICE_CPU, 0};
  view_.ndim = static_cast<int32_t>(shape_.size());
  view_.dtype = dtype_ == Dtype::F32 ? cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1}
                                     : cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1};
  view_.shape = shape_.data();
  view_.strides = nullptr;
  view_.byte_offset = 0;
  return &view_;
}

}  // namespace cad::testing
