// mpi_plugin_test.cpp -- the "mpi" communicator's own behaviour beyond the shared conformance
// checks: message chunking (what makes > 2 GiB transfers possible, exercised here with tiny chunks),
// config validation, sub-communicators, argument checks. Run under mpirun with any rank count.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "anchor.h"

namespace cad::mpi_test {
namespace {

// Uneven, deterministic byte counts (some zero) and a payload that names sender, receiver and index.
uint64_t pair_bytes(int from, int to) { return ((from * 7 + to * 3) % 5 == 0) ? 0 : 1 + (from * 13 + to * 29) % 37; }
char payload(int from, int to, uint64_t i) { return static_cast<char>(from * 31 + to * 17 + i * 7); }

TEST(MpiPlugin, RanksAreAPermutationAndTheDeviceIsTheCpu) {
  Comm& c = anchor();
  ASSERT_GE(c.rank(), 0);
  ASSERT_LT(c.rank(), c.world());
  std::vector<int32_t> ranks = gather_ints(c.rank());
  for (int r = 0; r < c.world(); ++r) EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
  cad_device_v1_t device{-1, -1};
  ASSERT_EQ(c.table()->get_device(c.ctx(), &device), CAD_STATUS_OK);
  EXPECT_EQ(device.device_type, CAD_DEVICE_CPU);
}

TEST(MpiPlugin, AllToAllVSplitsMessagesIntoChunks) {
  Comm c(table(), R"({"chunk_bytes": 3, "timeout_ms": 20000})");
  ASSERT_EQ(c.create_status(), CAD_STATUS_OK) << c.create_error();
  const int world = c.world(), me = c.rank();
  const size_t w = static_cast<size_t>(world);
  std::vector<uint64_t> send_counts(w), send_displs(w), recv_counts(w), recv_displs(w);
  uint64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < world; ++p) {
    send_counts[static_cast<size_t>(p)] = pair_bytes(me, p);
    recv_counts[static_cast<size_t>(p)] = pair_bytes(p, me);
  }
  // Displacements in reverse peer order with gaps, so that layout bugs show.
  for (int p = world - 1; p >= 0; --p) {
    send_displs[static_cast<size_t>(p)] = send_total + 1;
    send_total += send_counts[static_cast<size_t>(p)] + 1;
    recv_displs[static_cast<size_t>(p)] = recv_total + 2;
    recv_total += recv_counts[static_cast<size_t>(p)] + 2;
  }
  std::vector<char> send(send_total, 0), recv(recv_total, '#');
  for (int p = 0; p < world; ++p) {
    for (uint64_t i = 0; i < send_counts[static_cast<size_t>(p)]; ++i) {
      send[send_displs[static_cast<size_t>(p)] + i] = payload(me, p, i);
    }
  }
  ASSERT_EQ(c.table()->all_to_all_v(c.ctx(), send.data(), send_counts.data(), send_displs.data(), recv.data(),
                                    recv_counts.data(), recv_displs.data(), nullptr),
            CAD_STATUS_OK)
      << c.last_error();
  std::vector<char> expected(recv_total, '#');
  for (int p = 0; p < world; ++p) {
    for (uint64_t i = 0; i < recv_counts[static_cast<size_t>(p)]; ++i) {
      expected[recv_displs[static_cast<size_t>(p)] + i] = payload(p, me, i);
    }
  }
  EXPECT_EQ(recv, expected);
}

TEST(MpiPlugin, AllGatherSplitsMessagesIntoChunks) {
  Comm c(table(), R"({"chunk_bytes": 4, "timeout_ms": 20000})");
  ASSERT_EQ(c.create_status(), CAD_STATUS_OK) << c.create_error();
  const uint64_t bytes = 10;
  std::vector<char> send(bytes), recv(bytes * static_cast<uint64_t>(c.world()), '#');
  for (uint64_t i = 0; i < bytes; ++i) send[i] = payload(c.rank(), 0, i);
  ASSERT_EQ(c.all_gather(send.data(), bytes, recv.data()), CAD_STATUS_OK) << c.last_error();
  for (int r = 0; r < c.world(); ++r) {
    for (uint64_t i = 0; i < bytes; ++i) ASSERT_EQ(recv[static_cast<uint64_t>(r) * bytes + i], payload(r, 0, i));
  }
}

TEST(MpiPlugin, BadConfigsAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"timeout_ms": "soon"})", "'timeout_ms'"},
      {R"({"timeout_ms": 0})", "'timeout_ms'"},
      {R"({"chunk_bytes": 4294967296})", "'chunk_bytes'"},
      {R"({"ranks": [0, 0]})", "'ranks'"},
      {R"({"ranks": []})", "'ranks'"},
      {R"({"split_key": 1})", "'split_key'"},
      {R"({"ranks": [0], "split_color": 0})", "'ranks'"},
      {R"({"split_color": -1})", "'split_color'"},
      {R"([1, 2])", "expected a JSON object"},
  };
  for (const auto& [config, key] : cases) {
    Comm c(table(), config);
    EXPECT_EQ(c.create_status(), CAD_STATUS_INVALID_CONFIG) << config;
    EXPECT_NE(c.create_error().find(key), std::string::npos) << config << " -> " << c.create_error();
    EXPECT_EQ(c.ctx(), nullptr);
  }
}

TEST(MpiPlugin, ArgumentErrorsNameTheArgumentAndKeepTheInstanceUsable) {
  Comm& c = anchor();
  int stream_stand_in = 0;
  EXPECT_EQ(c.table()->barrier(c.ctx(), &stream_stand_in), CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(c.last_error().find("stream must be NULL"), std::string::npos) << c.last_error();
  const std::vector<uint64_t> zeros(static_cast<size_t>(c.world()), 0);
  EXPECT_EQ(c.table()->all_to_all_v(c.ctx(), nullptr, nullptr, zeros.data(), nullptr, zeros.data(), zeros.data(),
                                    nullptr),
            CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(c.last_error().find("send_counts is NULL"), std::string::npos) << c.last_error();
  std::vector<uint64_t> ones(static_cast<size_t>(c.world()), 1);
  EXPECT_EQ(c.table()->all_to_all_v(c.ctx(), nullptr, ones.data(), zeros.data(), nullptr, zeros.data(), zeros.data(),
                                    nullptr),
            CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(c.last_error().find("send is NULL"), std::string::npos) << c.last_error();
  // A displacement that wraps the buffer's address around the end of the address space (the old
  // check only asked whether displ + count overflows, not buffer + displ + count): refused, nothing written.
  std::vector<char> buffer(static_cast<size_t>(c.world()), 'x');
  std::vector<uint64_t> wrap(static_cast<size_t>(c.world()), 0);
  wrap[static_cast<size_t>(c.rank())] = UINT64_MAX - 4;
  EXPECT_EQ(c.table()->all_to_all_v(c.ctx(), buffer.data(), ones.data(), zeros.data(), buffer.data(), ones.data(),
                                    wrap.data(), nullptr),
            CAD_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(c.last_error().find("recv_displs[" + std::to_string(c.rank()) + "]"), std::string::npos) << c.last_error();
  EXPECT_EQ(std::string(buffer.begin(), buffer.end()), std::string(buffer.size(), 'x'));
  EXPECT_EQ(c.table()->get_rank(c.ctx(), nullptr), CAD_STATUS_INVALID_ARGUMENT);
  // None of these reached the wire, so the group is still in step.
  EXPECT_EQ(c.barrier(), CAD_STATUS_OK) << c.last_error();
  EXPECT_EQ(c.last_error(), "");
}

TEST(MpiPlugin, SplitColorFormsOneCommunicatorPerColor) {
  const int me = anchor().rank(), world = anchor().world();
  const int color = me % 2;
  // Key: reverse world order inside each color.
  Comm c(table(), "{\"split_color\": " + std::to_string(color) + ", \"split_key\": " + std::to_string(world - me) + "}");
  ASSERT_EQ(c.create_status(), CAD_STATUS_OK) << c.create_error();
  const int same_color = (world + 1 - color) / 2;  // ranks with this parity
  EXPECT_EQ(c.world(), same_color);
  EXPECT_EQ(c.rank(), same_color - 1 - me / 2);
  // The sub-communicator's all_gather sees only this color's world ranks, in its own rank order.
  const int32_t world_rank = me;
  std::vector<int32_t> members(static_cast<size_t>(c.world()), -1);
  ASSERT_EQ(c.all_gather(&world_rank, sizeof(world_rank), members.data()), CAD_STATUS_OK) << c.last_error();
  for (int r = 0; r < c.world(); ++r) EXPECT_EQ(members[static_cast<size_t>(r)], color + 2 * (same_color - 1 - r));
}

TEST(MpiPlugin, RanksListFormsASubCommunicatorOfTheListedRanksOnly) {
  const int me = anchor().rank(), world = anchor().world();
  // The first half (at least rank 0), listed in reverse order.
  const int members = (world + 1) / 2;
  std::string list;
  for (int r = members - 1; r >= 0; --r) list += (list.empty() ? "" : ", ") + std::to_string(r);
  Comm c(table(), "{\"ranks\": [" + list + "]}");
  if (me >= members) {
    EXPECT_EQ(c.create_status(), CAD_STATUS_INVALID_CONFIG);
    EXPECT_NE(c.create_error().find("'ranks'"), std::string::npos) << c.create_error();
  } else {
    ASSERT_EQ(c.create_status(), CAD_STATUS_OK) << c.create_error();
    EXPECT_EQ(c.world(), members);
    EXPECT_EQ(c.rank(), members - 1 - me);
    EXPECT_EQ(c.barrier(), CAD_STATUS_OK) << c.last_error();
  }
  Comm out_of_range(table(), "{\"ranks\": [" + std::to_string(world) + "]}");
  EXPECT_EQ(out_of_range.create_status(), CAD_STATUS_INVALID_CONFIG);
  EXPECT_NE(out_of_range.create_error().find("not below the world size"), std::string::npos)
      << out_of_range.create_error();
}

}  // namespace
}  // namespace cad::mpi_test
