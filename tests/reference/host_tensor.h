// host_tensor.h -- an owning CPU tensor for the tests (fp32 or bf16) that hands out a
// cad_tensor_v1_t view of itself. bf16 rounding here is the tests' own (nearest, ties to even,
// decided in double arithmetic), independent of the plugin's bf16.h.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "cad_common_v1.h"

namespace cad::testing {

enum class Dtype { F32, BF16 };

float round_to_bf16(float x);       // the nearest bf16 value, as a float
uint16_t bf16_bits(float rounded);  // the bits of a value that is already a bf16 value

class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(std::vector<int64_t> shape, Dtype dtype);

  int64_t numel() const;
  Dtype dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  float get(int64_t i) const;
  void set(int64_t i, float x);  // bf16 tensors store round_to_bf16(x)
  void fill(float x);
  void fill_uniform(std::mt19937& rng, float lo, float hi);
  std::vector<double> to_double() const;
  std::vector<uint8_t> bytes() const;  // raw storage, to check that a call left the tensor untouched

  // A view of this tensor, valid until the tensor is changed in shape or moved. Tests may edit the
  // returned descriptor (device, dtype, ...) to build invalid arguments.
  cad_tensor_v1_t* view();

 private:
  std::vector<int64_t> shape_;
  Dtype dtype_ = Dtype::F32;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
  cad_tensor_v1_t view_{};
};

}  // namespace cad::testing
