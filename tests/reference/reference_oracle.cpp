// reference_oracle.cpp -- see reference_oracle.h.
#include "reference_oracle.h"

#include <gtest/gtest.h>

namespace cad::testing {

PluginUnderTest& reference_plugin() {
  static PluginUnderTest plugin(CAD_REFERENCE_PLUGIN_PATH);
  return plugin;
}

void expect_matches_oracle(const Problem& p, Dtype dtype, double tolerance, unsigned seed) {
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{\"num_threads\": 2}");
  ASSERT_TRUE(instance.ok()) << instance.create_error();
  AttentionTensors t(p, dtype, seed);
  const RunStatus status = run_forward_backward(instance, plugin.api(), p, t);
  ASSERT_EQ(status.forward, CAD_STATUS_OK) << instance.last_error();
  ASSERT_EQ(status.backward, CAD_STATUS_OK) << instance.last_error();

  const NaiveForward want = naive_forward(p, t.q.to_double(), t.k.to_double(), t.v.to_double());
  const NaiveGradients grads = naive_backward(p, t.q.to_double(), t.k.to_double(), t.v.to_double(), t.d_o.to_double());
  EXPECT_LE(relative_error(t.o.to_double(), want.o), tolerance) << "O";
  EXPECT_LE(relative_error(t.lse.to_double(), want.lse), tolerance) << "LSE";
  EXPECT_LE(relative_error(t.d_q.to_double(), grads.d_q), tolerance) << "dQ";
  EXPECT_LE(relative_error(t.d_k.to_double(), grads.d_k), tolerance) << "dK";
  EXPECT_LE(relative_error(t.d_v.to_double(), grads.d_v), tolerance) << "dV";
}

}  // namespace cad::testing
