// kit_test.cpp -- the conformance kit's own parts, tested directly: the fp64 oracle (hand-computed
// cases and central finite differences of its forward for its backward), the plan checker on
// hand-made plans, the random piece tables, and the test services' leak accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "conformance.h"
#include "oracle.h"
#include "plan_checks.h"

namespace cc = cad::conformance;

namespace {

cc::AttentionProblem tiny_problem(bool causal, int64_t hq, int64_t hkv) {
  cc::AttentionProblem p;
  p.hq = hq;
  p.hkv = hkv;
  p.d = 3;
  p.causal = causal;
  p.scale = 0.7;
  // Two segments sharing one KV copy of length 4, plus an uncovered query row 0.
  p.segments = {{1, 2, 0, 4}, {3, 1, 0, 2}};
  p.tq = 4;
  p.tk = 5;  // KV row 4 is read by no segment
  double x = 0.1;
  const auto fill = [&x](std::vector<double>& v, size_t n) {
    for (size_t i = 0; i < n; ++i) v.push_back(std::sin(x += 0.37));
  };
  fill(p.q, p.tq * p.hq * p.d);
  fill(p.k, p.tk * p.hkv * p.d);
  fill(p.v, p.tk * p.hkv * p.d);
  return p;
}

}  // namespace

TEST(Oracle, SingleKeyCopiesValueAndLseIsTheScore) {
  cc::AttentionProblem p;
  p.d = 2;
  p.tq = 1;
  p.tk = 1;
  p.scale = 0.5;
  p.segments = {{0, 1, 0, 1}};
  p.q = {1.0, 2.0};
  p.k = {3.0, -1.0};
  p.v = {0.25, -4.0};
  const cc::ForwardResult r = cc::oracle_forward(p);
  EXPECT_DOUBLE_EQ(r.o[0], 0.25);
  EXPECT_DOUBLE_EQ(r.o[1], -4.0);
  EXPECT_DOUBLE_EQ(r.lse[0], 0.5 * (3.0 - 2.0));
}

TEST(Oracle, CausalMaskIsBottomRightAligned) {
  // q_len 1 against kv_len 3: the single query is the last one and sees all three keys; with equal
  // scores the output is the mean of the values and LSE = log 3.
  cc::AttentionProblem p;
  p.d = 1;
  p.tq = 1;
  p.tk = 3;
  p.scale = 1.0;
  p.segments = {{0, 1, 0, 3}};
  p.q = {0.0};
  p.k = {1.0, 2.0, 3.0};
  p.v = {3.0, 6.0, 9.0};
  const cc::ForwardResult r = cc::oracle_forward(p);
  EXPECT_NEAR(r.o[0], 6.0, 1e-12);
  EXPECT_NEAR(r.lse[0], std::log(3.0), 1e-12);
}

// window_left = 0: each query sees only its own key, so the oracle's dQ and dK are exactly zero. A
// backend's rounding of that zero (bf16: about 1e-3 of the inputs' scale) must pass under the bf16
// tolerance -- the relative measure divided it by the 1e-6 floor and failed every correct backend -- while
// a gradient as large as the inputs' scale still fails, and nonzero references keep the relative measure.
TEST(Measure, ExactZeroReferenceIsMeasuredAgainstTheInputsScale) {
  cc::AttentionProblem p = tiny_problem(true, 2, 1);
  p.window_left = 0;
  p.segments = {{0, 4, 0, 4}};
  p.tk = 4;
  p.k.resize(static_cast<size_t>(p.tk * p.hkv * p.d));
  p.v.resize(static_cast<size_t>(p.tk * p.hkv * p.d));
  std::vector<double> d_o;
  double x = 0.3;
  for (int64_t i = 0; i < p.tq * p.hq * p.d; ++i) d_o.push_back(std::cos(x += 0.61));
  const cc::BackwardResult g = cc::oracle_backward(p, d_o);
  for (double v : g.d_q) ASSERT_EQ(v, 0.0);
  for (double v : g.d_k) ASSERT_EQ(v, 0.0);
  const cc::ResultScales scales = cc::result_scales(p, d_o);
  ASSERT_GT(scales.d_q, 0.1);
  ASSERT_GT(scales.d_k, 0.1);

  std::vector<double> rounded(g.d_q.size());
  for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = (i % 2 ? 1 : -1) * 1e-3 * scales.d_q;
  EXPECT_LE(cc::max_error(rounded, g.d_q, 1e-6, scales.d_q), 1e-2);  // bf16's rounding of zero passes
  EXPECT_GT(cc::max_error(std::vector<double>(rounded.size(), 1e-3), g.d_q, 1e-6, 1e-6), 1e-2)
      << "a scale of 1e-6 would be the old floor: the same rounding failed";
  std::vector<double> wrong = rounded;
  wrong[3] = 0.5 * scales.d_q;  // a real gradient where there is none
  EXPECT_GT(cc::max_error(wrong, g.d_q, 1e-6, scales.d_q), 1e-2);
  std::vector<double> nan = rounded;
  nan[0] = std::nan("");
  EXPECT_TRUE(std::isinf(cc::max_error(nan, g.d_q, 1e-6, scales.d_q)));

  // A nonzero reference: the relative measure, whatever zero_scale says.
  const std::vector<double> want = {2.0, -4.0, 1.0};
  EXPECT_NEAR(cc::max_error({2.0, -4.04, 1.0}, want, 1e-6, 1e6), 0.01, 1e-12);
  EXPECT_DOUBLE_EQ(cc::max_error({2.0, -4.0, 1.0}, want, 1e-6, 1e6), 0.0);
  EXPECT_TRUE(std::isinf(cc::max_error({2.0}, want, 1e-6, 1.0)));  // a size mismatch never passes
}

TEST(Oracle, UncoveredRowsAreZeroWithLseMinusInfinity) {
  const cc::AttentionProblem p = tiny_problem(true, 2, 1);
  const cc::ForwardResult r = cc::oracle_forward(p);
  for (int64_t c = 0; c < p.hq * p.d; ++c) EXPECT_EQ(r.o[c], 0.0);
  for (int64_t h = 0; h < p.hq; ++h) EXPECT_TRUE(std::isinf(r.lse[h * p.tq]) && r.lse[h * p.tq] < 0);
  EXPECT_FALSE(std::isinf(r.lse[1]));
}

// L = sum(O * W): the oracle's backward must match central differences of its forward.
class OracleGradient : public ::testing::TestWithParam<bool> {};

TEST_P(OracleGradient, MatchesFiniteDifferences) {
  cc::AttentionProblem p = tiny_problem(GetParam(), 2, 1);
  std::vector<double> w;
  for (size_t i = 0; i < p.q.size(); ++i) w.push_back(std::cos(1.3 * static_cast<double>(i)));
  const auto loss = [&](const cc::AttentionProblem& at) {
    const cc::ForwardResult r = cc::oracle_forward(at);
    double sum = 0.0;
    for (size_t i = 0; i < r.o.size(); ++i) sum += r.o[i] * w[i];
    return sum;
  };
  const cc::BackwardResult g = cc::oracle_backward(p, w);
  const double eps = 1e-6;
  const auto check = [&](std::vector<double> cc::AttentionProblem::*field, const std::vector<double>& grad,
                         const char* name) {
    for (size_t i = 0; i < (p.*field).size(); ++i) {
      cc::AttentionProblem plus = p, minus = p;
      (plus.*field)[i] += eps;
      (minus.*field)[i] -= eps;
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      EXPECT_NEAR(grad[i], numeric, 1e-7) << name << "[" << i << "]";
    }
  };
  check(&cc::AttentionProblem::q, g.d_q, "dQ");
  check(&cc::AttentionProblem::k, g.d_k, "dK");
  check(&cc::AttentionProblem::v, g.d_v, "dV");
  // KV row 4 is read by no segment.
  for (int64_t c = 0; c < p.hkv * p.d; ++c) EXPECT_EQ(g.d_k[4 * p.hkv * p.d + c], 0.0);
}

INSTANTIATE_TEST_SUITE_P(CausalAndFull, OracleGradient, ::testing::Bool());

namespace {

cc::PieceTables two_ranks() {
  cc::PieceTables t;
  // doc 7 (length 5) split over both ranks, doc 9 (length 1) on rank 1.
  t.ranks = {{{7, 5, 0, 3}}, {{7, 5, 3, 2}, {9, 1, 0, 1}}};
  t.refresh_views();
  return t;
}

cad_plan_v1_t plan_of(std::vector<cad_task_v1_t>& tasks, int servers) {
  return cad_plan_v1_t{sizeof(cad_plan_v1_t), CAD_PLAN_FORMAT_VERSION, servers, tasks.data(),
                       static_cast<int64_t>(tasks.size())};
}

}  // namespace

TEST(PlanChecks, AcceptsAValidPlan) {
  std::vector<cad_task_v1_t> tasks = {{7, 0, 2, 0, 0}, {9, 0, 1, 0, 0}, {7, 2, 5, 1, 0}};
  EXPECT_EQ(cc::plan_violation(two_ranks(), 2, plan_of(tasks, 2)), "");
}

TEST(PlanChecks, NamesEachViolation) {
  const cc::PieceTables t = two_ranks();
  const auto violation = [&](std::vector<cad_task_v1_t> tasks) { return cc::plan_violation(t, 2, plan_of(tasks, 2)); };
  EXPECT_NE(violation({{7, 0, 3, 0, 0}, {9, 0, 1, 0, 0}, {7, 2, 5, 1, 0}}).find("covered twice"), std::string::npos);
  EXPECT_NE(violation({{7, 0, 2, 0, 0}, {9, 0, 1, 0, 0}, {7, 3, 5, 1, 0}}).find("not covered"), std::string::npos);
  EXPECT_NE(violation({{7, 0, 2, 0, 0}, {9, 0, 1, 0, 0}}).find("not covered"), std::string::npos);
  EXPECT_NE(violation({{9, 0, 1, 0, 0}, {7, 0, 2, 0, 0}, {7, 2, 5, 1, 0}}).find("not sorted"), std::string::npos);
  EXPECT_NE(violation({{7, 0, 2, 0, 0}, {9, 0, 1, 0, 0}, {7, 2, 5, 2, 0}}).find("server out of range"), std::string::npos);
  EXPECT_NE(violation({{7, 0, 2, 0, 0}, {9, 0, 1, 0, 1}, {7, 2, 5, 1, 0}}).find("reserved"), std::string::npos);
  EXPECT_NE(violation({{7, 0, 2, 0, 0}, {7, 2, 2, 0, 0}, {9, 0, 1, 0, 0}, {7, 2, 5, 1, 0}}).find("non-empty"),
            std::string::npos);
  EXPECT_NE(violation({{7, 0, 2, 0, 0}, {8, 0, 1, 0, 0}, {9, 0, 1, 0, 0}, {7, 2, 5, 1, 0}}).find("unknown document"),
            std::string::npos);
  std::vector<cad_task_v1_t> tasks = {{7, 0, 5, 0, 0}, {9, 0, 1, 0, 0}};
  cad_plan_v1_t plan = plan_of(tasks, 2);
  plan.format_version = 2;
  EXPECT_NE(cc::plan_violation(t, 2, plan).find("format_version"), std::string::npos);
}

TEST(PlanChecks, RandomPieceTablesTileEveryDocumentAndKeepEmptyRanks) {
  for (int ranks : {1, 2, 3, 8}) {
    std::mt19937_64 rng(static_cast<uint64_t>(ranks));
    const int empty = ranks >= 3 ? 1 : 0;
    cc::PieceTables t = cc::random_piece_tables(ranks, empty, rng);
    int empty_seen = 0;
    for (const auto& r : t.ranks) empty_seen += r.empty() ? 1 : 0;
    EXPECT_EQ(empty_seen, empty);
    // The colocated plan (every piece on its owner) must be valid for these tables.
    std::vector<cad_task_v1_t> tasks;
    for (int r = 0; r < ranks; ++r) {
      for (const auto& p : t.ranks[r]) tasks.push_back({p.doc_id, p.offset_in_doc, p.offset_in_doc + p.len, r, 0});
    }
    std::sort(tasks.begin(), tasks.end(), [](const cad_task_v1_t& a, const cad_task_v1_t& b) {
      return std::tie(a.server, a.doc_id, a.q_begin) < std::tie(b.server, b.doc_id, b.q_begin);
    });
    EXPECT_EQ(cc::plan_violation(t, ranks, plan_of(tasks, ranks)), "") << ranks << " ranks";
  }
}

TEST(TestServices, CountsOutstandingBytesAndRefusesCudaWithoutCuda) {
  cc::TestServices services;
  const cad_host_services_v1_t* s = services.table();
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, 1000, nullptr, &a), CAD_STATUS_OK);
  ASSERT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, 24, nullptr, &b), CAD_STATUS_OK);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  EXPECT_EQ(services.outstanding_bytes(), 1024);
  s->free(s->host_ctx, {CAD_DEVICE_CPU, 0}, a, nullptr);
  EXPECT_EQ(services.outstanding_bytes(), 24);
  s->free(s->host_ctx, {CAD_DEVICE_CPU, 0}, b, nullptr);
  EXPECT_EQ(services.outstanding_bytes(), 0);
  void* zero = &a;
  EXPECT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, 0, nullptr, &zero), CAD_STATUS_OK);
  EXPECT_EQ(zero, nullptr);
  // Rounding SIZE_MAX up to the alignment wrapped to 0: OK with a 0-byte block (issue 10).
  void* huge = nullptr;
  EXPECT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, SIZE_MAX, nullptr, &huge), CAD_STATUS_OUT_OF_MEMORY);
  EXPECT_EQ(huge, nullptr);
  EXPECT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CPU, 0}, SIZE_MAX - 100, nullptr, &huge), CAD_STATUS_OUT_OF_MEMORY);
  EXPECT_EQ(services.outstanding_bytes(), 0);
#ifndef CAD_KIT_WITH_CUDA
  void* device = nullptr;
  EXPECT_EQ(s->allocate(s->host_ctx, {CAD_DEVICE_CUDA, 0}, 64, nullptr, &device), CAD_STATUS_UNSUPPORTED);
#endif
}

TEST(TestServices, LookupFindsOnlyRegisteredInstancesOfTheRightKind) {
  cc::TestServices services;
  const cad_host_services_v1_t* s = services.table();
  int table = 0, instance = 0;
  services.add_instance("comm", CAD_PLUGIN_KIND_COMMUNICATOR, &table, &instance);
  const void* found_table = nullptr;
  void* found = nullptr;
  EXPECT_EQ(s->lookup_plugin(s->host_ctx, "comm", CAD_PLUGIN_KIND_COMMUNICATOR, &found_table, &found), CAD_STATUS_OK);
  EXPECT_EQ(found_table, &table);
  EXPECT_EQ(found, &instance);
  EXPECT_EQ(s->lookup_plugin(s->host_ctx, "comm", CAD_PLUGIN_KIND_BALANCER, &found_table, &found), CAD_STATUS_NOT_FOUND);
  EXPECT_EQ(s->lookup_plugin(s->host_ctx, "other", CAD_PLUGIN_KIND_COMMUNICATOR, &found_table, &found),
            CAD_STATUS_NOT_FOUND);
}

TEST(Report, CountsPassedFailedAndSkippedSeparately) {
  cc::Report r;
  r.pass("a");
  r.fail("b", "why");
  r.skip("c", "no GPU");
  EXPECT_TRUE(r.expect(true, "d", "unused"));
  EXPECT_FALSE(r.expect(false, "e", "broken"));
  EXPECT_EQ(r.passed(), 2);
  EXPECT_EQ(r.failed(), 2);
  EXPECT_EQ(r.skipped(), 1);
  EXPECT_EQ(r.checks[2].detail, "skipped: no GPU");
}
