// reference_gradcheck_test.cpp -- gradients against central finite differences of the fp64 forward
// on tiny shapes, for the loss L = sum(O * W) with a random W (so dL/dO = W): this checks the tests'
// own fp64 backward and, through it and directly, the plugin's backward.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "naive_attention.h"
#include "plugin_under_test.h"

namespace cad::testing {
namespace {

double loss(const Problem& p, const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
            const std::vector<double>& w) {
  const NaiveForward f = naive_forward(p, q, k, v);
  double sum = 0;
  for (size_t i = 0; i < w.size(); ++i) sum += f.o[i] * w[i];
  return sum;
}

enum class Wrt { Q, K, V };

std::vector<double> finite_difference(const Problem& p, std::vector<double> q, std::vector<double> k,
                                      std::vector<double> v, const std::vector<double>& w, Wrt wrt) {
  constexpr double kEps = 1e-6;
  std::vector<double>& x = wrt == Wrt::Q ? q : wrt == Wrt::K ? k : v;
  std::vector<double> grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + kEps;
    const double up = loss(p, q, k, v, w);
    x[i] = saved - kEps;
    const double down = loss(p, q, k, v, w);
    x[i] = saved;
    grad[i] = (up - down) / (2 * kEps);
  }
  return grad;
}

struct GradCase {
  const char* name;
  bool causal;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class ReferenceGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(ReferenceGradcheck, BackwardMatchesFiniteDifferences) {
  // Two segments sharing KV rows 0..3 (so dK/dV must sum both), GQA with 2 query heads per KV head,
  // an uncovered Q row (7) and an unread KV row (6).
  Problem p;
  p.tq = 8;
  p.tk = 7;
  p.hq = 2;
  p.hkv = 1;
  p.d = 4;
  p.scale = 0.5f;
  p.causal = GetParam().causal;
  p.segments = {{0, 3, 0, 4}, {3, 4, 0, 6}};

  PluginUnderTest plugin(CAD_REFERENCE_PLUGIN_PATH);
  Instance instance(plugin, "{}");
  AttentionTensors t(p, Dtype::F32, 99);
  const RunStatus status = run_forward_backward(instance, plugin.api(), p, t);  // dO = t.d_o plays W
  ASSERT_EQ(status.forward, CAD_STATUS_OK) << instance.last_error();
  ASSERT_EQ(status.backward, CAD_STATUS_OK) << instance.last_error();

  const auto q = t.q.to_double(), k = t.k.to_double(), v = t.v.to_double(), w = t.d_o.to_double();
  const NaiveGradients naive = naive_backward(p, q, k, v, w);
  const std::vector<double> fd_q = finite_difference(p, q, k, v, w, Wrt::Q);
  const std::vector<double> fd_k = finite_difference(p, q, k, v, w, Wrt::K);
  const std::vector<double> fd_v = finite_difference(p, q, k, v, w, Wrt::V);

  // Finite differences give tiny non-zeros where the true gradient is 0; compare with a tolerance
  // instead of relative_error's exact-zero rule.
  const auto rel = [](const std::vector<double>& got, const std::vector<double>& want) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::fabs(got[i] - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    return diff / std::max(scale, 1e-30);
  };
  EXPECT_LE(rel(naive.d_q, fd_q), 1e-7);
  EXPECT_LE(rel(naive.d_k, fd_k), 1e-7);
  EXPECT_LE(rel(naive.d_v, fd_v), 1e-7);
  EXPECT_LE(rel(t.d_q.to_double(), fd_q), 1e-5);
  EXPECT_LE(rel(t.d_k.to_double(), fd_k), 1e-5);
  EXPECT_LE(rel(t.d_v.to_double(), fd_v), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Masks, ReferenceGradcheck, ::testing::Values(GradCase{"causal", true}, GradCase{"noncausal", false}),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

}  // namespace
}  // namespace cad::testing
