// topology_mpi_test.cpp -- topology-aware plans under mpirun (2 nodes x 2 ranks at -np 4, 4 x 2 at -np 8):
// CAD over balancers that plan with a node map of 2 ranks per node gives the reference's O, LSE, dQ, dK, dV
// exactly (fp32, 1e-5); the plan CAD gets moves no more bytes across nodes than the topology-blind one; and
// the node map is compared on every rank at create (node_map_communicator): a stack where one rank
// configures another map is refused on every rank, naming rank 0, the rank that differs and both values.
#include "cad_mpi_harness.h"
#include "node_map.h"
#include "plan_model.h"

namespace {

using namespace cad_mpi_test;

constexpr int kRanksPerNode = 2;

// The stack: a node-map-aware prefix_aware and distca (checked over "comm"), a blind prefix_aware, and CAD
// over each of the aware ones.
std::string topology_stack() {
  const nlohmann::json node_map = {{"ranks_per_node", kRanksPerNode}, {"node_map_communicator", "comm"}};
  nlohmann::json instances = nlohmann::json::array();
  instances.push_back({{"name", "comm"}, {"plugin", "mpi"}, {"config", {{"timeout_ms", 60000}}}});
  instances.push_back({{"name", "server"}, {"plugin", "reference"}, {"config", {{"num_threads", 1}}}});
  instances.push_back({{"name", "bal_aware"}, {"plugin", "prefix_aware"}, {"config", node_map}});
  instances.push_back({{"name", "bal_distca"}, {"plugin", "distca"}, {"config", node_map}});
  instances.push_back({{"name", "bal_blind"}, {"plugin", "prefix_aware"}, {"config", nlohmann::json::object()}});
  for (const char* b : {"aware", "distca"}) {
    instances.push_back({{"name", std::string("cad_") + b},
                         {"plugin", "cad"},
                         {"config", {{"communicator", "comm"}, {"balancer", std::string("bal_") + b},
                                     {"server_backend", "server"}, {"min_shard_tokens", 8}}}});
  }
  return nlohmann::json{{"log_level", "warn"}, {"instances", instances}}.dump();
}

// A stack whose balancer takes `config` on this rank: its create status and message.
std::pair<cad_status_t, std::string> create_with_balancer(const nlohmann::json& config) {
  nlohmann::json instances = nlohmann::json::array();
  instances.push_back({{"name", "comm"}, {"plugin", "mpi"}, {"config", {{"timeout_ms", 60000}}}});
  instances.push_back({{"name", "bal"}, {"plugin", "prefix_aware"}, {"config", config}});
  const std::string text = nlohmann::json{{"log_level", "off"}, {"instances", instances}}.dump();
  cad_host_options_v1_t options{};
  options.struct_size = sizeof(options);
  options.config_json = text.c_str();
  options.search_path = CAD_TEST_PLUGIN_DIR;
  try {
    cad::Host host(options);
    return {CAD_STATUS_OK, ""};
  } catch (const cad::Error& e) {
    return {e.status(), e.what()};
  }
}

TEST(TopologyMpi, WorldIsWholeNodes) { ASSERT_EQ(g_world % kRanksPerNode, 0) << "run with an even -np"; }

TEST(TopologyMpi, CadWithTopologyAwarePlansMatchesTheReference) {
  for (const char* name : {"cad_aware", "cad_distca"}) {
    for (uint64_t seed : {3u, 11u, 29u}) {
      SCOPED_TRACE(std::string(name) + " seed " + std::to_string(seed));
      const GlobalBatch b = cad_test::make_batch(spec_for(seed));
      expect_step_matches(cad_instance_named(name), b, true);
      expect_step_matches(cad_instance_named(name), b, seed == 3u ? false : true, seed == 11u ? 16 : -1);
    }
  }
}

// What the balancer gives CAD (the same instance, the same cost params) moves no more bytes across nodes
// than the topology-blind balancer's plan, on a batch where the difference shows.
TEST(TopologyMpi, ThePlanCadGetsMovesNoMoreBytesAcrossNodes) {
  const auto aware = g_host->find<cad_balancer_v1_t>("bal_aware", CAD_PLUGIN_KIND_BALANCER);
  const auto blind = g_host->find<cad_balancer_v1_t>("bal_blind", CAD_PLUGIN_KIND_BALANCER);
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof(cost);
  cost.num_q_heads = 4;
  cost.num_kv_heads = 2;
  cost.head_dim = 16;
  cost.bytes_per_element = 4;
  cost.causal = 1;
  cost.min_shard_tokens = 8;
  const cad::plan::NodeMap nodes{kRanksPerNode, cad::plan::kDefaultInterNodeByteCost};
  int64_t inter_aware = 0, inter_blind = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    BatchSpec spec = spec_for(seed);
    spec.tokens_per_rank = 400;
    const GlobalBatch b = cad_test::make_batch(spec);
    std::vector<cad_rank_pieces_v1_t> views;
    for (const auto& r : b.pieces) views.push_back({r.data(), static_cast<int64_t>(r.size())});
    cad_balance_input_v1_t input{};
    input.struct_size = sizeof(input);
    input.ranks = views.data();
    input.num_ranks = g_world;
    input.num_servers = g_world;
    input.cost = &cost;
    for (auto [bal, sum] : {std::make_pair(aware, &inter_aware), std::make_pair(blind, &inter_blind)}) {
      cad_plan_v1_t* plan = nullptr;
      ASSERT_EQ(bal.first->plan(bal.second, &input, &plan), CAD_STATUS_OK) << bal.first->last_error(bal.second);
      const auto st = cad::plan::evaluate_plan(b.pieces, g_world, plan->tasks, plan->num_tasks,
                                               cad::plan::model_params(cost));
      *sum += cad::plan::split_by_node(st, nodes).inter_total;
      bal.first->release_plan(bal.second, plan);
    }
  }
  EXPECT_LT(inter_aware, inter_blind);
}

TEST(TopologyMpi, ARankWithAnotherNodeMapIsRefusedOnEveryRank) {
  const bool last = g_rank == g_world - 1;
  const auto differ_size = create_with_balancer(
      {{"ranks_per_node", last ? 4 : 2}, {"node_map_communicator", "comm"}});
  EXPECT_EQ(differ_size.first, CAD_STATUS_INVALID_CONFIG) << differ_size.second;
  const std::string want = "rank 0 has ranks_per_node 2, inter_node_byte_cost 9, rank " + std::to_string(g_world - 1) +
                           " has ranks_per_node 4";
  EXPECT_NE(differ_size.second.find(want), std::string::npos) << differ_size.second;
  EXPECT_TRUE(same_on_every_rank(differ_size.second));

  const auto differ_cost = create_with_balancer(
      {{"ranks_per_node", 2}, {"inter_node_byte_cost", last ? 4.5 : 9.0}, {"node_map_communicator", "comm"}});
  EXPECT_EQ(differ_cost.first, CAD_STATUS_INVALID_CONFIG) << differ_cost.second;
  EXPECT_NE(differ_cost.second.find("has ranks_per_node 2, inter_node_byte_cost 4.5"), std::string::npos)
      << differ_cost.second;

  // One rank without the key is one node there: refused too.
  const auto missing = create_with_balancer(
      last ? nlohmann::json{{"node_map_communicator", "comm"}}
           : nlohmann::json{{"ranks_per_node", 2}, {"node_map_communicator", "comm"}});
  EXPECT_EQ(missing.first, CAD_STATUS_INVALID_CONFIG) << missing.second;
  EXPECT_NE(missing.second.find("no ranks_per_node (one node)"), std::string::npos) << missing.second;

  // All alike: created.
  const auto same = create_with_balancer({{"ranks_per_node", 2}, {"node_map_communicator", "comm"}});
  EXPECT_EQ(same.first, CAD_STATUS_OK) << same.second;
}

}  // namespace

int main(int argc, char** argv) {
  return cad_mpi_test::run_mpi_tests(argc, argv, topology_stack, "CAD stack");
}
