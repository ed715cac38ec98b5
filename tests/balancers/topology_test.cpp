// topology_test.cpp -- the node map (plugins/common/balancer_topology.h, planning/node_map.h): every balancer
// reads "ranks_per_node" and "inter_node_byte_cost" and refuses bad values naming the key; plans over several
// nodes stay valid; prefix_aware's topology-aware plan keeps the balance of the topology-blind one and moves
// fewer bytes across nodes; one node (no keys) is the plan before the node map.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "balancer_harness.h"
#include "batch_recipe.h"
#include "doc_lengths.h"
#include "node_map.h"
#include "plugin_paths.h"
#include "random_layout.h"

namespace {

using namespace cad::balancer_test;
using cad::plan::NodeMap;

cad::plan::PlanStats stats_of(const RankPieces& batch, int32_t servers, const PlanResult& plan,
                              const cad_cost_params_v1_t& cost) {
  return cad::plan::evaluate_plan(batch, servers, plan.tasks.data(), static_cast<int64_t>(plan.tasks.size()),
                                  cad::plan::model_params(cost));
}

// The plan invariant, checked here independently of the plugin's own check: per document the tasks tile
// [0, doc_len) exactly once, servers in range.
void expect_valid(const RankPieces& batch, int32_t servers, const PlanResult& plan) {
  ASSERT_EQ(plan.status, CAD_STATUS_OK) << plan.error;
  std::map<int64_t, int64_t> len;
  for (const auto& r : batch)
    for (const auto& p : r) len[p.doc_id] = p.doc_len;
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> ranges;
  for (const auto& t : plan.tasks) {
    ASSERT_GE(t.server, 0);
    ASSERT_LT(t.server, servers);
    ranges[t.doc_id].push_back({t.q_begin, t.q_end});
  }
  ASSERT_EQ(ranges.size(), len.size());
  for (auto& [doc, r] : ranges) {
    std::sort(r.begin(), r.end());
    int64_t covered = 0;
    for (const auto& [b, e] : r) {
      ASSERT_EQ(b, covered) << "document " << doc;
      covered = e;
    }
    EXPECT_EQ(covered, len[doc]) << "document " << doc;
  }
}

TEST(NodeMapConfig, EveryBalancerRefusesBadValuesNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"ranks_per_node": 0})", "ranks_per_node"},
      {R"({"ranks_per_node": "8"})", "ranks_per_node"},
      {R"({"ranks_per_node": 2.5})", "ranks_per_node"},
      {R"({"inter_node_byte_cost": 0.5})", "inter_node_byte_cost"},
      {R"({"inter_node_byte_cost": "9"})", "inter_node_byte_cost"},
      {R"({"node_map_communicator": 3})", "node_map_communicator"},
  };
  for (const std::string& name : all_balancers()) {
    for (const auto& [config, key] : bad) {
      LoadedBalancer b(plugin_path(name), config);
      EXPECT_EQ(b.create_status(), CAD_STATUS_INVALID_CONFIG) << name << " " << config;
      EXPECT_NE(b.create_error().find(key), std::string::npos) << name << ": " << b.create_error();
    }
    LoadedBalancer good(plugin_path(name), R"({"ranks_per_node": 8, "inter_node_byte_cost": 4.5})");
    EXPECT_EQ(good.create_status(), CAD_STATUS_OK) << name << ": " << good.create_error();
  }
}

TEST(NodeMapConfig, ACommunicatorThatIsNotThereIsRefused) {
  // The harness's host lends no plugin lookup: no instance can be found by that name.
  LoadedBalancer b(plugin_path("prefix_aware"), R"({"ranks_per_node": 2, "node_map_communicator": "comm"})");
  EXPECT_EQ(b.create_status(), CAD_STATUS_INVALID_CONFIG);
  EXPECT_NE(b.create_error().find("'comm', which is no communicator instance"), std::string::npos) << b.create_error();
}

TEST(NodeMap, SplitsLinkBytesByNode) {
  // 4 ranks in nodes of 2; document 1 (on rank 0) computed on rank 1 (same node) and rank 2 (other node).
  const RankPieces batch = {{{1, 1000, 0, 1000}}, {}, {}, {}};
  const auto cost = cost_params(1);
  PlanResult plan;
  plan.status = CAD_STATUS_OK;
  plan.tasks = {{1, 0, 400, 1, 0}, {1, 400, 700, 2, 0}, {1, 700, 1000, 0, 0}};
  const auto st = stats_of(batch, 4, plan, cost);
  const NodeMap nodes{2, 9.0};
  const auto split = cad::plan::split_by_node(st, nodes);
  const auto m = cad::plan::model_params(cost);
  // Rank 1: 400 Q rows and a 400-token KV prefix; rank 2: 300 rows and a 700-token prefix; O/LSE come back.
  const int64_t to1 = 400 * m.q_row_bytes() + 400 * m.kv_token_bytes();
  const int64_t to2 = 300 * m.q_row_bytes() + 700 * m.kv_token_bytes();
  const int64_t back1 = 400 * (m.o_row_bytes() + m.lse_row_bytes());
  const int64_t back2 = 300 * (m.o_row_bytes() + m.lse_row_bytes());
  EXPECT_EQ(split.intra_total, to1 + back1);
  EXPECT_EQ(split.inter_total, to2 + back2);
  EXPECT_EQ(split.intra_total + split.inter_total, st.total_bytes);
  EXPECT_EQ(split.inter_sent[0], to2);
  EXPECT_EQ(split.inter_received[0], back2);
  EXPECT_EQ(split.inter_sent[2], back2);
  EXPECT_EQ(split.intra_received[1], to1);
  EXPECT_EQ(split.inter_sent[1] + split.inter_received[1] + split.inter_sent[3] + split.inter_received[3], 0);
  // One node: nothing leaves it.
  EXPECT_EQ(cad::plan::split_by_node(st, NodeMap{}).inter_total, 0);
  EXPECT_EQ(nodes.node_of(3), 1);
  EXPECT_FALSE((NodeMap{4, 9.0}.multi_node(4)));
}

TEST(NodeMapPlans, ValidOnRandomLayoutsForEveryBalancer) {
  for (const std::string& name : all_balancers()) {
    LoadedBalancer b(plugin_path(name), R"({"ranks_per_node": 3, "inter_node_byte_cost": 9})");
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      LayoutOptions o;
      o.ranks = 8;  // nodes of 3: the last node holds 2 ranks
      o.docs = 40;
      const RankPieces batch = random_layout(seed, o);
      SCOPED_TRACE(name + " seed " + std::to_string(seed));
      expect_valid(batch, 8, b.plan(batch, 8, cost_params(16)));
    }
  }
}

TEST(NodeMapPlans, OneNodeIsThePlanWithoutANodeMap) {
  LoadedBalancer plain(plugin_path("prefix_aware"));
  LoadedBalancer one(plugin_path("prefix_aware"), R"({"ranks_per_node": 8})");
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    LayoutOptions o;
    o.ranks = 8;
    const RankPieces batch = random_layout(seed, o);
    const PlanResult a = plain.plan(batch, 8, cost_params(16));
    const PlanResult b = one.plan(batch, 8, cost_params(16));
    ASSERT_EQ(a.status, CAD_STATUS_OK) << a.error;
    ASSERT_EQ(b.tasks.size(), a.tasks.size());
    for (size_t i = 0; i < a.tasks.size(); ++i) {
      EXPECT_EQ(std::memcmp(&a.tasks[i], &b.tasks[i], sizeof(cad_task_v1_t)), 0) << "task " << i;
    }
  }
}

const std::vector<int64_t>& pretrain_lengths() {
  static const std::vector<int64_t> lengths = [] {
    if (!std::filesystem::exists(CAD_PRETRAIN_LENGTHS)) return std::vector<int64_t>{};
    return cad::workload::load_lengths(CAD_PRETRAIN_LENGTHS);
  }();
  return lengths;
}

// Pretrain batches in nodes of 8: the aware plan is as balanced as the blind one (both <= 1.05), never moves
// more bytes across nodes, and at 64 ranks (8 nodes) moves far fewer (docs/slow_links.md has the table).
TEST(NodeMapPlans, PrefixAwareKeepsBalanceAndMovesFewerInterNodeBytesOnPretrain) {
  if (pretrain_lengths().empty()) GTEST_SKIP() << CAD_PRETRAIN_LENGTHS << " not found";
  LoadedBalancer blind(plugin_path("prefix_aware"));
  LoadedBalancer aware(plugin_path("prefix_aware"), R"({"ranks_per_node": 8})");
  LoadedBalancer distca(plugin_path("distca"), R"({"ranks_per_node": 8})");
  const NodeMap nodes{8, cad::plan::kDefaultInterNodeByteCost};
  const auto cost = cost_params(128);
  for (const auto& [ranks, context] : std::vector<std::pair<int32_t, int64_t>>{{16, 65536}, {64, 65536}, {64, 131072}}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks x " + std::to_string(context));
    const RankPieces batch = cad::workload::sample_batch(pretrain_lengths(), context, ranks, 1);
    const PlanResult b = blind.plan(batch, ranks, cost);
    const PlanResult a = aware.plan(batch, ranks, cost);
    const PlanResult d = distca.plan(batch, ranks, cost);
    expect_valid(batch, ranks, a);
    ASSERT_EQ(b.status, CAD_STATUS_OK) << b.error;
    ASSERT_EQ(d.status, CAD_STATUS_OK) << d.error;
    const auto sb = stats_of(batch, ranks, b, cost);
    const auto sa = stats_of(batch, ranks, a, cost);
    const auto sd = stats_of(batch, ranks, d, cost);
    EXPECT_LE(sa.imbalance, 1.05);
    // The same balance: within the bound both plan to (tolerance 0.02), or the blind plan's if it missed it.
    EXPECT_LE(sa.imbalance, std::max(sb.imbalance, 1.02));
    const int64_t inter_blind = cad::plan::split_by_node(sb, nodes).inter_total;
    const int64_t inter_aware = cad::plan::split_by_node(sa, nodes).inter_total;
    const int64_t inter_distca = cad::plan::split_by_node(sd, nodes).inter_total;
    EXPECT_LT(inter_aware, inter_blind);
    EXPECT_LT(inter_aware, inter_distca);
    if (ranks >= 64) {
      EXPECT_LE(static_cast<double>(inter_aware), 0.6 * static_cast<double>(inter_blind));
    }
  }
}

}  // namespace
