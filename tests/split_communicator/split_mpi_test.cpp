// split_mpi_test.cpp -- the "split" communicator under mpirun at -np 4 as 2 nodes x 2 ranks, over two "mpi"
// instances ("fast" for pairs inside a node, "slow" for pairs across nodes): every byte of uneven all-to-alls
// lands where it should and the gaps stay untouched; all_gather and barrier work; a count mismatch on a pair
// inside a node is reported by 'intra' and one across nodes by 'inter' (which half carried which pair); CAD
// over the split communicator gives the reference's O, LSE, dQ, dK, dV; configs that cannot work are refused
// on every rank, naming the key and the rank.
#include "cad_mpi_harness.h"

#include <cstdint>
#include <vector>

namespace {

using namespace cad_mpi_test;

constexpr int kRanksPerNode = 2;
using Comm = std::pair<const cad_communicator_v1_t*, void*>;

nlohmann::json mpi_instance(const std::string& name, int64_t timeout_ms = 60000) {
  return {{"name", name}, {"plugin", "mpi"}, {"config", {{"timeout_ms", timeout_ms}}}};
}

nlohmann::json split_config(int ranks_per_node = kRanksPerNode) {
  return {{"ranks_per_node", ranks_per_node}, {"intra", "fast"}, {"inter", "slow"}, {"timeout_ms", 60000}};
}

std::string split_stack() {
  nlohmann::json instances = nlohmann::json::array();
  instances.push_back(mpi_instance("fast"));
  instances.push_back(mpi_instance("slow"));
  instances.push_back({{"name", "split"}, {"plugin", "split"}, {"config", split_config()}});
  nlohmann::json one_after_the_other = split_config();
  one_after_the_other["concurrent"] = false;
  instances.push_back({{"name", "split_seq"}, {"plugin", "split"}, {"config", one_after_the_other}});
  instances.push_back({{"name", "server"}, {"plugin", "reference"}, {"config", {{"num_threads", 1}}}});
  instances.push_back({{"name", "bal"}, {"plugin", "prefix_aware"}, {"config", {{"ranks_per_node", kRanksPerNode}}}});
  instances.push_back({{"name", "cad_split"},
                       {"plugin", "cad"},
                       {"config", {{"communicator", "split"}, {"balancer", "bal"}, {"server_backend", "server"},
                                   {"min_shard_tokens", 8}}}});
  return nlohmann::json{{"log_level", "warn"}, {"instances", instances}}.dump();
}

// Builds a stack of its own on every rank: the status and message of its create.
std::pair<cad_status_t, std::string> create_stack(const nlohmann::json& instances) {
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

uint8_t payload(uint64_t seed, int from, int to, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(from) * 1000003u + static_cast<uint64_t>(to) * 7919u + i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint8_t>(x >> 56);
}

// Bytes from `from` to `to` in round `seed`: uneven, some zero, the same on every rank.
uint64_t count(uint64_t seed, int from, int to) {
  const uint64_t c = (seed * 31 + static_cast<uint64_t>(from) * 17 + static_cast<uint64_t>(to) * 5) % 23;
  return c % 5 == 0 ? 0 : c * 41 + 3;
}

constexpr uint8_t kCanary = 0xA5;

// One all-to-all through `comm`, peers laid out in reverse order with gaps; checks every byte and the gaps.
void expect_all_to_all(const Comm& comm, uint64_t seed) {
  const int w = g_world;
  std::vector<uint64_t> sc(w), sd(w), rc(w), rd(w);
  uint64_t send_total = 0, recv_total = 0;
  for (int p = w - 1; p >= 0; --p) {
    sc[p] = count(seed, g_rank, p);
    sd[p] = send_total;
    send_total += sc[p] + 7;
    rc[p] = count(seed, p, g_rank);
    rd[p] = recv_total;
    recv_total += rc[p] + 7;
  }
  std::vector<uint8_t> send(send_total, 0), recv(recv_total, kCanary);
  for (int p = 0; p < w; ++p) {
    for (uint64_t i = 0; i < sc[p]; ++i) send[sd[p] + i] = payload(seed, g_rank, p, i);
  }
  ASSERT_EQ(comm.first->all_to_all_v(comm.second, send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(),
                                     nullptr),
            CAD_STATUS_OK)
      << comm.first->last_error(comm.second);
  for (int p = 0; p < w; ++p) {
    for (uint64_t i = 0; i < rc[p]; ++i) {
      ASSERT_EQ(recv[rd[p] + i], payload(seed, p, g_rank, i)) << "rank " << g_rank << ": byte " << i << " from " << p;
    }
    for (uint64_t i = rc[p]; i < rc[p] + 7; ++i) {
      ASSERT_EQ(recv[rd[p] + i], kCanary) << "rank " << g_rank << ": gap after the bytes from " << p << " written";
    }
  }
}

TEST(SplitMpi, WorldIsWholeNodes) { ASSERT_EQ(g_world % kRanksPerNode, 0) << "run with an even -np"; }

TEST(SplitMpi, UnevenAllToAllsArriveExactly) {
  const Comm split = g_host->find<cad_communicator_v1_t>("split", CAD_PLUGIN_KIND_COMMUNICATOR);
  int32_t rank = -1, world = -1;
  ASSERT_EQ(split.first->get_rank(split.second, &rank), CAD_STATUS_OK);
  ASSERT_EQ(split.first->get_world_size(split.second, &world), CAD_STATUS_OK);
  EXPECT_EQ(rank, g_rank);
  EXPECT_EQ(world, g_world);
  for (uint64_t seed = 1; seed <= 6; ++seed) expect_all_to_all(split, seed);
  // The halves one after the other on the calling thread: the same bytes.
  const Comm seq = g_host->find<cad_communicator_v1_t>("split_seq", CAD_PLUGIN_KIND_COMMUNICATOR);
  for (uint64_t seed = 7; seed <= 9; ++seed) expect_all_to_all(seq, seed);
}

TEST(SplitMpi, AllGatherAndBarrier) {
  const Comm split = g_host->find<cad_communicator_v1_t>("split", CAD_PLUGIN_KIND_COMMUNICATOR);
  const uint32_t mine = 1000u + static_cast<uint32_t>(g_rank);
  std::vector<uint32_t> all(static_cast<size_t>(g_world), 0);
  ASSERT_EQ(split.first->all_gather(split.second, &mine, sizeof(mine), all.data(), nullptr), CAD_STATUS_OK)
      << split.first->last_error(split.second);
  for (int r = 0; r < g_world; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], 1000u + static_cast<uint32_t>(r));
  ASSERT_EQ(split.first->barrier(split.second, nullptr), CAD_STATUS_OK) << split.first->last_error(split.second);
  int not_a_stream = 0;
  EXPECT_EQ(split.first->barrier(split.second, &not_a_stream), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(split.first->last_error(split.second)).find("stream must be NULL"), std::string::npos);
  ASSERT_EQ(split.first->barrier(split.second, nullptr), CAD_STATUS_OK) << "a refused stream broke the instance";
}

// On a stack of its own (the mismatch leaves its instances unusable): rank 0 sends 16 bytes to `peer`, which
// expects 8. The half that carries the pair (0, peer) detects it; every rank's message names that instance.
void expect_mismatch_reported_by(int peer, const std::string& instance, const std::string& key) {
  nlohmann::json instances = nlohmann::json::array();
  instances.push_back(mpi_instance("fast", 10000));
  instances.push_back(mpi_instance("slow", 10000));
  instances.push_back({{"name", "split"}, {"plugin", "split"}, {"config", split_config()}});
  const std::string text = nlohmann::json{{"log_level", "off"}, {"instances", instances}}.dump();
  cad_host_options_v1_t options{};
  options.struct_size = sizeof(options);
  options.config_json = text.c_str();
  options.search_path = CAD_TEST_PLUGIN_DIR;
  cad::Host host(options);
  const Comm split = host.find<cad_communicator_v1_t>("split", CAD_PLUGIN_KIND_COMMUNICATOR);
  const size_t w = static_cast<size_t>(g_world);
  std::vector<uint64_t> sc(w, 8), rc(w, 8), displs(w);
  for (size_t p = 0; p < w; ++p) displs[p] = 16 * p;
  if (g_rank == 0) sc[static_cast<size_t>(peer)] = 16;
  std::vector<uint8_t> send(16 * w, 1), recv(16 * w, 0);
  const cad_status_t status =
      split.first->all_to_all_v(split.second, send.data(), sc.data(), displs.data(), recv.data(), rc.data(),
                                displs.data(), nullptr);
  const std::string message = split.first->last_error(split.second);
  EXPECT_TRUE(status == CAD_STATUS_COMMUNICATION || status == CAD_STATUS_TIMEOUT) << message;
  EXPECT_NE(message.find("over '" + instance + "' (key '" + key + "') failed"), std::string::npos) << message;
  EXPECT_NE(message.find("plugin 'split' (rank " + std::to_string(g_rank) + ")"), std::string::npos) << message;
  // Unusable afterwards, and it says so.
  EXPECT_EQ(split.first->barrier(split.second, nullptr), CAD_STATUS_COMMUNICATION);
  EXPECT_NE(std::string(split.first->last_error(split.second)).find("unusable after an earlier failure"),
            std::string::npos);
}

TEST(SplitMpi, APairInsideANodeGoesThroughIntraAndAcrossThroughInter) {
  expect_mismatch_reported_by(1, "fast", "intra");            // ranks 0 and 1 share node 0
  expect_mismatch_reported_by(g_world - 1, "slow", "inter");  // the last rank is on another node
}

TEST(SplitMpi, CadThroughTheSplitMatchesTheReference) {
  for (uint64_t seed : {3u, 11u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const GlobalBatch b = cad_test::make_batch(spec_for(seed));
    expect_step_matches(cad_instance_named("cad_split"), b, true);
    expect_step_matches(cad_instance_named("cad_split"), b, false);
  }
}

TEST(SplitMpi, ConfigsThatCannotWorkAreRefusedOnEveryRank) {
  const std::string at_rank = "(rank " + std::to_string(g_rank) + ")";
  const auto stack = [](const nlohmann::json& split) {
    nlohmann::json instances = nlohmann::json::array();
    instances.push_back(mpi_instance("fast"));
    instances.push_back(mpi_instance("slow"));
    instances.push_back({{"name", "split"}, {"plugin", "split"}, {"config", split}});
    return instances;
  };
  {
    const auto [status, message] = create_stack(stack(split_config(3)));  // 3 does not divide 4
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'ranks_per_node' is 3, which does not divide the world size " +
                           std::to_string(g_world)), std::string::npos) << message;
    EXPECT_NE(message.find(at_rank), std::string::npos) << message;
  }
  {
    nlohmann::json config = split_config();
    config["inter"] = "no_such_comm";
    const auto [status, message] = create_stack(stack(config));
    EXPECT_EQ(status, CAD_STATUS_NOT_FOUND) << message;
    EXPECT_NE(message.find("key 'inter': no communicator instance named 'no_such_comm'"), std::string::npos) << message;
    EXPECT_NE(message.find(at_rank), std::string::npos) << message;
  }
  {
    nlohmann::json config = split_config();
    config.erase("intra");
    const auto [status, message] = create_stack(stack(config));
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'intra' is missing"), std::string::npos) << message;
  }
  {
    nlohmann::json config = split_config();
    config["inter"] = "fast";
    const auto [status, message] = create_stack(stack(config));
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("keys 'intra' and 'inter' both name 'fast'"), std::string::npos) << message;
    EXPECT_NE(message.find(at_rank), std::string::npos) << message;
  }
  {
    nlohmann::json config = split_config();
    config.erase("ranks_per_node");
    const auto [status, message] = create_stack(stack(config));
    EXPECT_EQ(status, CAD_STATUS_INVALID_CONFIG) << message;
    EXPECT_NE(message.find("key 'ranks_per_node' is missing"), std::string::npos) << message;
  }
}

}  // namespace

int main(int argc, char** argv) {
  return cad_mpi_test::run_mpi_tests(argc, argv, split_stack, "split stack", true);
}
