// plugin_contract_test.cpp -- what every balancer plugin owes, driven through the ABI: the plan
// invariant on random host layouts, canonical task order, byte-identical plans, refusal of bad input
// with messages that name the rank, piece and document, and config errors that name the key.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>

#include "balancer_harness.h"
#include "plugin_paths.h"
#include "random_layout.h"

namespace {

using namespace cad::balancer_test;

// Every document's tasks partition [0, doc_len); tasks sorted by (server, doc, q_begin).
void expect_valid_plan(const RankPieces& ranks, int32_t servers, const PlanResult& plan) {
  ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  EXPECT_EQ(plan.num_servers, servers);
  EXPECT_EQ(plan.format_version, static_cast<uint32_t>(CAD_PLAN_FORMAT_VERSION));
  std::map<int64_t, int64_t> doc_len;
  for (const auto& r : ranks)
    for (const auto& p : r) doc_len[p.doc_id] = p.doc_len;
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> covered;
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const auto& t = plan.tasks[i];
    EXPECT_GE(t.server, 0);
    EXPECT_LT(t.server, servers);
    EXPECT_LT(t.q_begin, t.q_end);
    EXPECT_EQ(t.reserved, 0);
    if (i > 0) {
      const auto& u = plan.tasks[i - 1];
      EXPECT_TRUE(u.server < t.server || (u.server == t.server && (u.doc_id < t.doc_id ||
                  (u.doc_id == t.doc_id && u.q_begin < t.q_begin)))) << "tasks out of order at " << i;
    }
    covered[t.doc_id].push_back({t.q_begin, t.q_end});
  }
  EXPECT_EQ(covered.size(), doc_len.size());
  for (auto& [doc, ranges] : covered) {
    std::sort(ranges.begin(), ranges.end());
    int64_t at = 0;
    for (const auto& [b, e] : ranges) {
      EXPECT_EQ(b, at) << "document " << doc;
      at = e;
    }
    EXPECT_EQ(at, doc_len[doc]) << "document " << doc;
  }
}

class BalancerContract : public ::testing::TestWithParam<std::string> {
 protected:
  LoadedBalancer balancer_{plugin_path(GetParam())};
};

TEST_P(BalancerContract, DescribesItself) {
  ASSERT_EQ(balancer_.create_status(), CAD_STATUS_OK) << balancer_.create_error();
  EXPECT_EQ(std::string(balancer_.plugin()->name), GetParam());
  EXPECT_EQ(balancer_.plugin()->struct_size, sizeof(cad_plugin_v1_t));
  EXPECT_EQ(balancer_.plugin()->balancer->struct_size, sizeof(cad_balancer_v1_t));
}

TEST_P(BalancerContract, PlansPartitionEveryDocumentOnRandomLayouts) {
  for (uint64_t seed = 0; seed < 30; ++seed) {
    LayoutOptions o;
    o.ranks = 1 + static_cast<int32_t>(seed % 7);
    o.empty_ranks = o.ranks > 2 ? 1 : 0;
    o.docs = 5 + static_cast<int32_t>(seed % 20);
    const RankPieces ranks = random_layout(seed, o);
    for (bool causal : {true, false}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (causal ? " causal" : " non-causal"));
      expect_valid_plan(ranks, o.ranks, balancer_.plan(ranks, o.ranks, cost_params(64, 0, causal)));
      // Extra attention servers that hold no tokens are allowed.
      expect_valid_plan(ranks, o.ranks + 2, balancer_.plan(ranks, o.ranks + 2, cost_params(64, 0, causal)));
    }
  }
}

TEST_P(BalancerContract, PlansAreByteIdenticalAcrossContextsAndRuns) {
  LoadedBalancer other(plugin_path(GetParam()));
  LayoutOptions o;
  o.ranks = 6;
  o.docs = 60;
  const RankPieces ranks = random_layout(42, o);
  const PlanResult a = balancer_.plan(ranks, 6, cost_params());
  const PlanResult b = other.plan(ranks, 6, cost_params());
  const PlanResult c = balancer_.plan(ranks, 6, cost_params());
  ASSERT_EQ(a.status, CAD_STATUS_OK) << a.error;
  ASSERT_EQ(a.tasks.size(), b.tasks.size());
  ASSERT_EQ(a.tasks.size(), c.tasks.size());
  EXPECT_EQ(std::memcmp(a.tasks.data(), b.tasks.data(), a.tasks.size() * sizeof(cad_task_v1_t)), 0);
  EXPECT_EQ(std::memcmp(a.tasks.data(), c.tasks.data(), a.tasks.size() * sizeof(cad_task_v1_t)), 0);
}

TEST_P(BalancerContract, EmptyBatchAndOneServer) {
  RankPieces empty(3);
  const PlanResult none = balancer_.plan(empty, 3, cost_params());
  ASSERT_EQ(none.status, CAD_STATUS_OK) << none.error;
  EXPECT_TRUE(none.tasks.empty());
  // One server computes everything it holds, as one task per contiguous run.
  RankPieces one = {{{5, 7, 0, 3}, {9, 1, 0, 1}, {5, 7, 3, 4}}};
  const PlanResult plan = balancer_.plan(one, 1, cost_params());
  expect_valid_plan(one, 1, plan);
  ASSERT_EQ(plan.tasks.size(), 2u);
  EXPECT_EQ(plan.tasks[0].doc_id, 5);
  EXPECT_EQ(plan.tasks[0].q_end, 7);
}

// Runs plan on `ranks` and expects INVALID_ARGUMENT with every word of `needles` in the message.
void expect_refused(const LoadedBalancer& b, const RankPieces& ranks, const std::vector<std::string>& needles) {
  const PlanResult r = b.plan(ranks, static_cast<int32_t>(std::max<size_t>(1, ranks.size())), cost_params());
  EXPECT_EQ(r.status, CAD_STATUS_INVALID_ARGUMENT);
  for (const auto& n : needles) EXPECT_NE(r.error.find(n), std::string::npos) << "'" << n << "' not in: " << r.error;
}

TEST_P(BalancerContract, RefusesPiecesThatDoNotTileTheirDocument) {
  // A gap: tokens [4, 6) of document 3 are held by nobody.
  expect_refused(balancer_, {{{3, 10, 0, 4}}, {{3, 10, 6, 4}}}, {"[4, 6)", "document 3", "rank 1 piece 0"});
  // An overlap.
  expect_refused(balancer_, {{{3, 10, 0, 6}}, {{8, 2, 0, 2}, {3, 10, 5, 5}}}, {"rank 1 piece 1", "document 3", "overlaps"});
  // Two pieces disagree on doc_len.
  expect_refused(balancer_, {{{3, 10, 0, 5}}, {{3, 11, 5, 5}}}, {"doc_len", "rank 1 piece 0", "document 3"});
  // A zero-length piece and a piece outside its document.
  expect_refused(balancer_, {{{3, 10, 0, 10}, {4, 5, 0, 0}}}, {"rank 0 piece 1", "document 4", "len = 0"});
  expect_refused(balancer_, {{}, {{4, 5, 2, 4}}}, {"rank 1 piece 0", "document 4", "outside"});
  // A missing tail.
  expect_refused(balancer_, {{{3, 10, 0, 9}}}, {"[9, 10)", "document 3"});
}

// Issue 10: a piece whose offset + len wraps int64 must be refused without computing the sum, and a
// batch whose cost does not fit the int64 model (one causal document of 2^40 tokens costs ~2^79 score
// entries) is refused as UNSUPPORTED naming the model, instead of planning on wrapped, negative costs.
TEST_P(BalancerContract, RefusesWhatTheInt64ModelCannotRepresent) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  expect_refused(balancer_, {{{3, kMax, kMax - 1, 2}}}, {"rank 0 piece 0", "outside"});
  const int64_t huge = int64_t{1} << 40;
  const RankPieces big = {{{1, huge, 0, huge / 2}}, {{1, huge, huge / 2, huge / 2}}};
  const PlanResult r = balancer_.plan(big, 2, cost_params());
  EXPECT_EQ(r.status, CAD_STATUS_UNSUPPORTED) << r.error;
  EXPECT_NE(r.error.find("int64"), std::string::npos) << r.error;
  EXPECT_TRUE(r.tasks.empty());
  // The largest document the model takes is planned normally.
  const int64_t fits = int64_t{1} << 31;
  const RankPieces ok = {{{1, fits, 0, fits / 2}}, {{1, fits, fits / 2, fits / 2}}};
  const PlanResult planned = balancer_.plan(ok, 2, cost_params());
  ASSERT_EQ(planned.status, CAD_STATUS_OK) << planned.error;
  for (const auto& t : planned.tasks) EXPECT_LT(t.q_begin, t.q_end);
}

TEST_P(BalancerContract, RefusesBadArgumentsAndLeavesTheOutputAlone) {
  RankPieces ranks = {{{1, 10, 0, 10}}, {}};
  cad_cost_params_v1_t cost = cost_params();
  cost.num_kv_heads = 3;  // 32 % 3 != 0
  PlanResult r = balancer_.plan(ranks, 2, cost);
  EXPECT_EQ(r.status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("num_kv_heads"), std::string::npos) << r.error;
  r = balancer_.plan(ranks, 0, cost_params());
  EXPECT_EQ(r.status, CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("num_servers"), std::string::npos) << r.error;
  r = balancer_.plan(ranks, 1, cost_params());  // fewer servers than ranks
  EXPECT_EQ(r.status, CAD_STATUS_UNSUPPORTED);

  const cad_balancer_v1_t* t = balancer_.plugin()->balancer;
  void* ctx = nullptr;
  cad_host_services_v1_t services{};
  services.struct_size = sizeof(services);
  services.abi_major = CAD_ABI_VERSION_MAJOR;
  char msg[256];
  ASSERT_EQ(t->create(&services, "{}", &ctx, msg, sizeof(msg)), CAD_STATUS_OK) << msg;
  cad_plan_v1_t* untouched = reinterpret_cast<cad_plan_v1_t*>(0x1);
  EXPECT_EQ(t->plan(ctx, nullptr, &untouched), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(untouched, reinterpret_cast<cad_plan_v1_t*>(0x1));
  EXPECT_NE(std::string(t->last_error(ctx)).find("input"), std::string::npos);
  t->release_plan(ctx, nullptr);  // a no-op
  t->destroy(ctx);
}

TEST_P(BalancerContract, ConfigErrorsNameTheKey) {
  const cad_balancer_v1_t* t = balancer_.plugin()->balancer;
  cad_host_services_v1_t services{};
  services.struct_size = sizeof(services);
  services.abi_major = CAD_ABI_VERSION_MAJOR;
  void* ctx = nullptr;
  char msg[256] = {0};
  EXPECT_EQ(t->create(&services, "[1,2]", &ctx, msg, sizeof(msg)), CAD_STATUS_INVALID_CONFIG);
  EXPECT_EQ(ctx, nullptr);
  if (GetParam() == "distca" || GetParam() == "prefix_aware") {
    EXPECT_EQ(t->create(&services, "{\"tolerance\": -1}", &ctx, msg, sizeof(msg)), CAD_STATUS_INVALID_CONFIG);
    EXPECT_NE(std::string(msg).find("tolerance"), std::string::npos) << msg;
  }
  // Unknown keys only warn.
  ASSERT_EQ(t->create(&services, "{\"no_such_key\": 1}", &ctx, msg, sizeof(msg)), CAD_STATUS_OK) << msg;
  t->destroy(ctx);
}

INSTANTIATE_TEST_SUITE_P(AllBalancers, BalancerContract, ::testing::ValuesIn(all_balancers()),
                         [](const auto& info) { return info.param; });

}  // namespace
