// reference_accuracy_test.cpp -- the reference plugin's O, LSE, dQ, dK, dV against the tests' own
// fp64 attention (naive_attention.cpp), over the shapes the ABI promises to handle.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>

#include "naive_attention.h"
#include "plugin_under_test.h"
#include "reference_oracle.h"

namespace cad::testing {
namespace {

struct Case {
  std::string name;
  Problem problem;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }  // gtest prints the name, not bytes

Problem make(int64_t tq, int64_t tk, int64_t hq, int64_t hkv, int64_t d, bool causal,
             std::vector<cad_segment_v1_t> segments) {
  Problem p;
  p.tq = tq;
  p.tk = tk;
  p.hq = hq;
  p.hkv = hkv;
  p.d = d;
  p.causal = causal;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  p.segments = std::move(segments);
  return p;
}

// A document of `doc_len` tokens cut into CAD tasks at `cuts`: every task's queries attend to the
// document's KV prefix up to the task's end, all tasks sharing one copy of that KV at kv_offset.
std::vector<cad_segment_v1_t> tasks_of_document(int64_t q_offset, int64_t kv_offset, std::vector<int64_t> cuts) {
  std::vector<cad_segment_v1_t> out;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    out.push_back({q_offset + cuts[i], cuts[i + 1] - cuts[i], kv_offset, cuts[i + 1]});
  }
  return out;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  cases.push_back({"single_causal", make(37, 37, 2, 2, 64, true, {{0, 37, 0, 37}})});
  cases.push_back({"single_noncausal", make(37, 37, 2, 2, 64, false, {{0, 37, 0, 37}})});
  cases.push_back({"gqa_causal", make(40, 40, 8, 2, 32, true, {{0, 15, 0, 15}, {15, 25, 15, 25}})});
  cases.push_back({"gqa_noncausal", make(40, 40, 6, 3, 32, false, {{0, 15, 0, 15}, {15, 25, 15, 25}})});
  {
    // Two documents as CAD server batches: doc A (50 tokens) as three tasks sharing one KV copy,
    // doc B (20 tokens) as two tasks; Q rows of the tasks are packed back to back.
    auto segs = tasks_of_document(0, 0, {0, 10, 30, 50});
    for (const auto& s : tasks_of_document(50, 50, {0, 7, 20})) segs.push_back(s);
    cases.push_back({"shared_kv_causal", make(70, 70, 4, 2, 16, true, segs)});
    cases.push_back({"shared_kv_noncausal", make(70, 70, 4, 2, 16, false, segs)});
  }
  cases.push_back({"q_shorter_than_kv_causal", make(12, 40, 2, 1, 32, true, {{0, 5, 0, 40}, {5, 7, 20, 20}})});
  cases.push_back({"q_shorter_than_kv_noncausal", make(12, 40, 2, 1, 32, false, {{0, 5, 0, 40}, {5, 7, 33, 7}})});
  cases.push_back({"q_longer_than_kv_noncausal", make(30, 9, 2, 2, 16, false, {{0, 30, 2, 7}})});
  // Length-1 and empty segments, Q rows no segment covers (1, 6, 7, 20..23), KV rows none reads (12..15).
  cases.push_back({"tiny_and_empty_causal",
                   make(24, 16, 2, 1, 16, true, {{0, 1, 0, 1}, {1, 0, 3, 5}, {2, 1, 0, 9}, {3, 3, 4, 3}, {8, 12, 0, 12}})});
  cases.push_back({"tiny_and_empty_noncausal",
                   make(24, 16, 2, 1, 16, false, {{0, 1, 0, 1}, {1, 0, 3, 5}, {2, 1, 0, 9}, {3, 3, 4, 0}, {8, 12, 0, 12}})});
  cases.push_back({"head_dim_256", make(20, 20, 2, 1, 256, true, {{0, 20, 0, 20}})});
  cases.push_back({"head_dim_40", make(20, 20, 2, 2, 40, false, {{0, 20, 0, 20}})});
  cases.push_back({"head_dim_3", make(20, 20, 2, 2, 3, true, {{0, 20, 0, 20}})});
  cases.push_back({"no_segments", make(6, 4, 2, 1, 16, true, {})});
  cases.push_back({"empty_batch", make(0, 0, 2, 1, 16, true, {})});
  {
    // Larger segments that cross the plugin's internal block sizes at odd places.
    auto segs = tasks_of_document(0, 0, {0, 40, 73, 140});
    segs.push_back({140, 50, 140, 70});
    cases.push_back({"blocks_causal", make(190, 210, 4, 2, 32, true, segs)});
  }
  return cases;
}

constexpr double kFp32Tolerance = 1e-5;
constexpr double kBf16Tolerance = 1e-2;

void expect_matches_oracle(const Problem& p, Dtype dtype, double tolerance) {
  cad::testing::expect_matches_oracle(p, dtype, tolerance, 42);
}

class ReferenceAccuracy : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceAccuracy, Fp32MatchesFp64Oracle) { expect_matches_oracle(GetParam().problem, Dtype::F32, kFp32Tolerance); }

TEST_P(ReferenceAccuracy, Bf16MatchesFp64Oracle) { expect_matches_oracle(GetParam().problem, Dtype::BF16, kBf16Tolerance); }

INSTANTIATE_TEST_SUITE_P(Cases, ReferenceAccuracy, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Rows no segment covers, and KV rows no segment reads, get exactly the values the ABI names.
TEST(ReferenceOutputs, UncoveredRowsAreWrittenExactly) {
  const Problem p = make(10, 8, 2, 1, 16, true, {{2, 3, 1, 4}});
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  AttentionTensors t(p, Dtype::F32, 7);
  const RunStatus status = run_forward_backward(instance, plugin.api(), p, t);
  ASSERT_EQ(status.forward, CAD_STATUS_OK) << instance.last_error();
  ASSERT_EQ(status.backward, CAD_STATUS_OK) << instance.last_error();
  for (int64_t row = 0; row < p.tq; ++row) {
    const bool covered = row >= 2 && row < 5;
    for (int64_t h = 0; h < p.hq; ++h) {
      const float lse = t.lse.get(h * p.tq + row);
      if (covered) {
        EXPECT_TRUE(std::isfinite(lse)) << "row " << row;
      } else {
        EXPECT_TRUE(std::isinf(lse) && lse < 0) << "row " << row;
      }
      for (int64_t e = 0; e < p.d; ++e) {
        const int64_t i = (row * p.hq + h) * p.d + e;
        if (!covered) {
          EXPECT_EQ(t.o.get(i), 0.0f) << "O row " << row;
          EXPECT_EQ(t.d_q.get(i), 0.0f) << "dQ row " << row;
        }
      }
    }
  }
  for (int64_t row = 0; row < p.tk; ++row) {
    const bool read = row >= 1 && row < 5;
    for (int64_t e = 0; e < p.d; ++e) {
      EXPECT_EQ(t.d_k.get(row * p.d + e) != 0.0f, read) << "dK row " << row;
      EXPECT_EQ(t.d_v.get(row * p.d + e) != 0.0f, read) << "dV row " << row;
    }
  }
}

// The stable softmax must survive scores far beyond exp()'s fp32 range (|s| up to ~250). fp32
// rounding of such scores limits the accuracy, hence the looser bound.
TEST(ReferenceOutputs, LargeScoresStayFinite) {
  Problem p = make(33, 33, 2, 1, 16, true, {{0, 33, 0, 33}});
  p.scale = 1.0f;
  PluginUnderTest& plugin = reference_plugin();
  Instance instance(plugin, "{}");
  AttentionTensors t(p, Dtype::F32, 3);
  std::mt19937 rng(5);
  t.q.fill_uniform(rng, -4.0f, 4.0f);
  t.k.fill_uniform(rng, -4.0f, 4.0f);
  const RunStatus status = run_forward_backward(instance, plugin.api(), p, t);
  ASSERT_EQ(status.forward, CAD_STATUS_OK) << instance.last_error();
  ASSERT_EQ(status.backward, CAD_STATUS_OK) << instance.last_error();
  const NaiveForward want = naive_forward(p, t.q.to_double(), t.k.to_double(), t.v.to_double());
  EXPECT_LE(relative_error(t.o.to_double(), want.o), 1e-4);
  EXPECT_LE(relative_error(t.lse.to_double(), want.lse), 1e-5);
  for (int64_t i = 0; i < t.d_q.numel(); ++i) ASSERT_TRUE(std::isfinite(t.d_q.get(i))) << i;
}

// Results are bitwise identical for any thread count (and from run to run).
TEST(ReferenceOutputs, BitwiseDeterministicAcrossThreadCounts) {
  const Case c = all_cases().back();  // blocks_causal: many items of uneven cost, shared KV, GQA
  PluginUnderTest& plugin = reference_plugin();
  std::vector<std::vector<uint8_t>> first;
  for (const char* config : {"{\"num_threads\": 1}", "{\"num_threads\": 3}", "{\"num_threads\": 3}"}) {
    Instance instance(plugin, config);
    AttentionTensors t(c.problem, Dtype::F32, 11);
    const RunStatus status = run_forward_backward(instance, plugin.api(), c.problem, t);
    ASSERT_EQ(status.forward, CAD_STATUS_OK) << instance.last_error();
    ASSERT_EQ(status.backward, CAD_STATUS_OK) << instance.last_error();
    const std::vector<std::vector<uint8_t>> outputs = {t.o.bytes(), t.lse.bytes(), t.d_q.bytes(), t.d_k.bytes(),
                                                       t.d_v.bytes()};
    if (first.empty()) {
      first = outputs;
    } else {
      for (size_t i = 0; i < outputs.size(); ++i) EXPECT_TRUE(outputs[i] == first[i]) << "output " << i << " " << config;
    }
  }
}

}  // namespace
}  // namespace cad::testing
