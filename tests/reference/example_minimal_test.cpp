// example_minimal_test.cpp -- the minimal example plugin (examples/minimal_attention) computes the
// same attention as the tests' fp64 oracle and refuses what its capabilities leave out.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "naive_attention.h"
#include "plugin_under_test.h"

namespace cad::testing {
namespace {

PluginUnderTest& example_plugin() {
  static PluginUnderTest plugin(CAD_EXAMPLE_PLUGIN_PATH);
  return plugin;
}

Problem make(int64_t tq, int64_t tk, int64_t h, int64_t d, bool causal, std::vector<cad_segment_v1_t> segments) {
  Problem p;
  p.tq = tq;
  p.tk = tk;
  p.hq = p.hkv = h;
  p.d = d;
  p.causal = causal;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  p.segments = std::move(segments);
  return p;
}

void expect_matches_oracle(const Problem& p) {
  PluginUnderTest& plugin = example_plugin();
  Instance instance(plugin, "{}");
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  AttentionTensors t(p, Dtype::F32, 17);
  const RunStatus status = run_forward_backward(instance, plugin.api(), p, t);
  ASSERT_EQ(status.forward, CAD_STATUS_OK) << instance.last_error();
  ASSERT_EQ(status.backward, CAD_STATUS_OK) << instance.last_error();
  const auto q = t.q.to_double(), k = t.k.to_double(), v = t.v.to_double();
  const NaiveForward want = naive_forward(p, q, k, v);
  const NaiveGradients grads = naive_backward(p, q, k, v, t.d_o.to_double());
  EXPECT_LE(relative_error(t.o.to_double(), want.o), 1e-5) << "O";
  EXPECT_LE(relative_error(t.lse.to_double(), want.lse), 1e-5) << "LSE";
  EXPECT_LE(relative_error(t.d_q.to_double(), grads.d_q), 1e-5) << "dQ";
  EXPECT_LE(relative_error(t.d_k.to_double(), grads.d_k), 1e-5) << "dK";
  EXPECT_LE(relative_error(t.d_v.to_double(), grads.d_v), 1e-5) << "dV";
}

TEST(ExampleMinimal, CausalSharedKvMatchesOracle) {
  // A document as two tasks sharing its KV, a second document, and an uncovered Q row (30).
  expect_matches_oracle(make(31, 30, 2, 32, true, {{0, 8, 0, 8}, {8, 12, 0, 20}, {20, 10, 20, 10}}));
}

TEST(ExampleMinimal, NonCausalMatchesOracle) {
  expect_matches_oracle(make(20, 24, 2, 16, false, {{0, 12, 0, 24}, {12, 8, 4, 6}}));
}

TEST(ExampleMinimal, EmptyBatch) { expect_matches_oracle(make(0, 0, 1, 16, true, {})); }

// What the capabilities leave out is refused with UNSUPPORTED, outputs untouched.
void expect_unsupported(const Problem& p, Dtype dtype) {
  PluginUnderTest& plugin = example_plugin();
  Instance instance(plugin, "{}");
  AttentionTensors t(p, dtype, 5);
  const auto before = t.o.bytes();
  cad_attention_forward_args_v1_t args = forward_args(p, t);
  EXPECT_EQ(plugin.api()->forward(instance.ctx(), &args), CAD_STATUS_UNSUPPORTED);
  EXPECT_STRNE(instance.last_error(), "");
  EXPECT_TRUE(t.o.bytes() == before);
}

TEST(ExampleMinimal, RefusesBf16) { expect_unsupported(make(8, 8, 2, 16, true, {{0, 8, 0, 8}}), Dtype::BF16); }

TEST(ExampleMinimal, RefusesGqa) {
  Problem p = make(8, 8, 4, 16, true, {{0, 8, 0, 8}});
  p.hkv = 2;
  expect_unsupported(p, Dtype::F32);
}

TEST(ExampleMinimal, RefusesHeadDimsOutsideItsMask) {
  expect_unsupported(make(8, 8, 1, 144, true, {{0, 8, 0, 8}}), Dtype::F32);
  expect_unsupported(make(8, 8, 1, 8, true, {{0, 8, 0, 8}}), Dtype::F32);
}

TEST(ExampleMinimal, DeclaresWhatItDoes) {
  PluginUnderTest& plugin = example_plugin();
  EXPECT_STREQ(plugin.plugin()->name, "example_minimal");
  Instance instance(plugin, nullptr);
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(plugin.api()->get_capabilities(instance.ctx(), &caps), CAD_STATUS_OK);
  EXPECT_EQ(caps.dtype_mask, static_cast<uint32_t>(CAD_ATTENTION_DTYPE_FP32));
  EXPECT_EQ(caps.flags & CAD_ATTENTION_CAP_GQA, 0u);
  EXPECT_EQ(caps.max_head_dim, 128);
  Instance bad(plugin, "{oops");
  EXPECT_EQ(bad.create_status(), CAD_STATUS_INVALID_CONFIG);
}

}  // namespace
}  // namespace cad::testing
