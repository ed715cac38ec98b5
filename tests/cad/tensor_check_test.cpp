// tensor_check_test.cpp -- plugin_support's check_tensor (every in-tree plugin's tensor validation): the
// layout rule that strides must be compact row-major, and what it does not apply to.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plugin_support.h"

namespace {

using cad::plugin::DType;

struct View {
  std::vector<float> data = std::vector<float>(64);
  std::vector<int64_t> shape, strides;
  cad_tensor_v1_t tensor{};
  View(std::vector<int64_t> s, std::vector<int64_t> st) : shape(std::move(s)), strides(std::move(st)) {
    tensor.data = data.data();
    tensor.device = {CAD_DEVICE_CPU, 0};
    tensor.ndim = static_cast<int32_t>(shape.size());
    tensor.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
    tensor.shape = shape.data();
    tensor.strides = strides.empty() ? nullptr : strides.data();
  }
};

// "" when accepted, else the failure's message.
std::string check(const View& v) {
  try {
    cad::plugin::check_tensor(&v.tensor, {"lse", CAD_DEVICE_CPU, {-1, -1}, {"Hq", "Tq"}, {DType::F32}});
    return "";
  } catch (const cad::plugin::Failure& f) {
    return f.what();
  }
}

TEST(CheckTensor, CompactStridesAcceptedOthersRefusedNamingTheTensor) {
  EXPECT_EQ(check(View({4, 8}, {8, 1})), "");
  EXPECT_EQ(check(View({4, 8}, {})), "");  // NULL strides mean compact
  const std::string padded = check(View({4, 8}, {16, 1}));
  EXPECT_NE(padded.find("lse"), std::string::npos) << padded;
  EXPECT_NE(padded.find("compact row-major"), std::string::npos) << padded;
  EXPECT_NE(check(View({4, 8}, {1, 4})), "");  // column-major
}

// A rank with no tokens hands CAD [Hq, 0] statistics and [0, H, D] rows; PyTorch gives an empty [4, 0]
// tensor strides (1, 1). No element is addressed, so no stride is wrong.
TEST(CheckTensor, EmptyTensorsAcceptAnyStrides) {
  EXPECT_EQ(check(View({4, 0}, {1, 1})), "");
  EXPECT_EQ(check(View({0, 4}, {123, 7})), "");
  // Non-empty tensors are still held to the rule.
  EXPECT_NE(check(View({4, 1}, {2, 1})), "");
}

}  // namespace
