// The network term as named parameters: the overlap rule, the fitted (bytes, seconds) curve and its
// refusals, the overlap in a rank's pass, and the intra- / inter-node split of a plan's bytes.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "calibration_fixture.h"
#include "comm_model.h"
#include "plan_work.h"
#include "simulation.h"
#include "step_model.h"

namespace sim = cad::simulate;

namespace {

std::string curve_refusal(const std::string& json) {
  try {
    sim::parse_link_curve(json, "curve.json", nullptr);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

// Llama-8B, 32K tokens per rank of 300 short documents and 8 of 64K, planned by prefix_aware: a batch whose
// plans move bytes between every pair of ranks.
sim::Scenario short_and_long_documents() {
  sim::Scenario s;
  s.shape = sim::model_preset("llama-8b");
  for (int i = 0; i < 300; ++i) s.lengths.push_back(500 + (i * 7919) % 9000);
  for (int i = 0; i < 8; ++i) s.lengths.push_back(65536);
  s.context = 32768;
  sim::BalancerSpec b;
  b.name = "prefix_aware";
  s.balancers.push_back(b);
  s.search_path = CAD_BALANCER_PLUGIN_DIR;
  return s;
}

}  // namespace

TEST(SimulateNetwork, OverlapHidesItsShareUpToTheCompute) {
  EXPECT_DOUBLE_EQ(sim::overlapped_seconds(3, 2, 0), 5);       // nothing hidden
  EXPECT_DOUBLE_EQ(sim::overlapped_seconds(3, 2, 1), 3);       // max(compute, exchange)
  EXPECT_DOUBLE_EQ(sim::overlapped_seconds(1, 2, 1), 2);
  EXPECT_DOUBLE_EQ(sim::overlapped_seconds(3, 2, 0.25), 4.5);  // a quarter of the exchange hidden
  EXPECT_DOUBLE_EQ(sim::overlapped_seconds(0.2, 2, 0.25), 2);  // at most the compute is hidden
}

TEST(SimulateNetwork, FittedCurveInterpolatesFloorsAndExtends) {
  sim::SystemCalibration c = sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}});
  std::string source;
  c.net_curve = sim::parse_link_curve(
      R"({"source": "fitted: test", "points": [{"bytes": 1e6, "seconds": 1e-4}, {"bytes": 1e8, "seconds": 5e-3}]})",
      "curve.json", &source);
  EXPECT_EQ(source, "fitted: test");
  EXPECT_EQ(sim::inter_node_seconds(c, 0), 0);
  EXPECT_DOUBLE_EQ(sim::inter_node_seconds(c, 1e3), 1e-4);  // below the first point: its seconds
  EXPECT_NEAR(sim::inter_node_seconds(c, 5.05e7), 0.5 * (1e-4 + 5e-3), 1e-15);  // halfway, linear in bytes
  // Past the last point: its segment's slope (4.9e-3 s per 9.9e7 B).
  EXPECT_NEAR(sim::inter_node_seconds(c, 2e8), 5e-3 + 1e8 * 4.9e-3 / 9.9e7, 1e-12);
  // The curve replaces latency + bytes / bandwidth (which would give 20 us + 1e8 / 40e9).
  EXPECT_NEAR(sim::inter_node_seconds(c, 1e8), 5e-3, 1e-15);
}

TEST(SimulateNetwork, BadCurvesAreNamed) {
  EXPECT_EQ(curve_refusal(R"({"points": [{"bytes": 1, "seconds": 1}]})"),
            "curve.json: key 'source' is missing (expected a non-empty string)");
  EXPECT_EQ(curve_refusal(R"({"source": "x", "points": []})"),
            "curve.json: key 'points' must be a non-empty list of {bytes, seconds}");
  EXPECT_EQ(curve_refusal(R"({"source": "x", "points": [{"bytes": 2, "seconds": 1}, {"bytes": 2, "seconds": 2}]})"),
            "curve.json: key 'points[1].bytes' must be larger than the previous point's (strictly increasing)");
  EXPECT_NE(curve_refusal(R"({"source": "x", "points": [{"bytes": 1, "seconds": 2}, {"bytes": 2, "seconds": 1}]})")
                .find("key 'points[1].seconds' must not be smaller"),
            std::string::npos);
  EXPECT_EQ(curve_refusal(R"({"source": "x", "points": [{"bytes": 1, "seconds": 0}]})"),
            "curve.json: key 'points[0].seconds' must be a number > 0, got 0");
}

TEST(SimulateNetwork, PingPongModeHidesTheNamedOverlap) {
  sim::ModelShape s;
  s.name = "tiny";
  s.layers = 2;
  s.hidden = 4;
  s.heads = 2;
  s.kv_heads = 1;
  s.head_dim = 2;
  s.mlp = 8;
  s.vocab = 10;
  sim::SystemCalibration c = sim::testing::calibration(1, 4000, 0, {{1e6, 10}, {1e9, 300}});
  sim::RankWork w;
  w.tokens = 1000;
  w.attention.fwd = 1e-3;  // each pass's compute is at least the 1 ms exchange: the overlap alone decides
  w.attention.bwd = 2e-3;
  w.bytes.sent_inter = 4e7 - 20e-6 * 40e9;  // 1 ms over the network (40 GB/s effective, 20 us latency)
  const sim::Layout one{1, 8, 1, 1};
  const sim::RankTime off = sim::rank_time(w, s, one, c, false);
  c.overlap = 0;
  EXPECT_NEAR(sim::rank_time(w, s, one, c, true).total, off.total, 1e-15);
  c.overlap = 1;
  const sim::RankTime full = sim::rank_time(w, s, one, c, true);
  c.overlap = 0.25;
  const sim::RankTime quarter = sim::rank_time(w, s, one, c, true);
  // 2 layers x 2 passes, each hiding 0.25 ms (a quarter) or the whole 1 ms.
  EXPECT_NEAR(off.total - quarter.total, 2 * 2 * 0.25e-3, 1e-12);
  EXPECT_NEAR(off.total - full.total, 2 * 2 * 1e-3, 1e-12);
  EXPECT_NEAR(quarter.comm_exposed, 2 * 2 * 0.75e-3, 1e-12);
}

TEST(SimulateNetwork, BytesSplitByNode) {
  sim::Scenario s = short_and_long_documents();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}});
  auto run = [&](int64_t gpus_per_node) {
    s.layout = sim::Layout{8, gpus_per_node, 1, 1};
    return sim::simulate(s, cal, *rates).at(0);
  };
  const sim::BalancerResult one_node = run(8), two = run(4), each = run(1);
  // The same plan in every case: its bytes, only split differently.
  for (const sim::BalancerResult* r : {&one_node, &two, &each}) {
    EXPECT_NEAR(r->bytes_intra_per_layer + r->bytes_inter_per_layer, r->bytes_per_layer, 1e-6 * r->bytes_per_layer);
  }
  ASSERT_GT(one_node.bytes_per_layer, 0);
  EXPECT_DOUBLE_EQ(one_node.bytes_inter_per_layer, 0);
  EXPECT_DOUBLE_EQ(each.bytes_intra_per_layer, 0);
  EXPECT_GT(two.bytes_inter_per_layer, 0);
  EXPECT_GT(two.bytes_intra_per_layer, 0);
  EXPECT_GT(each.max_inter_sent_per_gpu, 0);
  EXPECT_LE(each.max_inter_sent_per_gpu, each.bytes_inter_per_layer);
}

// The split of an exchange's price by where its bytes go: a byte to another node pays the link (latency + bytes /
// (GB/s x efficiency)), a byte inside the node the NVLink curve, the two at once; and a rank's exchange follows
// its own bytes, so the step (the slowest rank) follows the busiest GPU's inter-node bytes, not their total.
TEST(SimulateNetwork, InterNodeBytesPayTheLinkRate) {
  sim::SystemCalibration cal = sim::testing::calibration(500, 4000, 48, {{1e6, 300}, {1e9, 300}});
  const double link_s = 20e-6 + 1e9 / (50 * 0.8 * 1e9);  // 1 GB over 50 GB/s x 0.8, plus 20 us
  sim::RankBytes inter;
  inter.sent_inter = 1e9;
  inter.received_inter = 0.5e9;
  EXPECT_NEAR(sim::all_to_all_seconds(cal, inter), link_s, 1e-12);
  sim::RankBytes intra;
  intra.sent_intra = 1e9;
  EXPECT_NEAR(sim::all_to_all_seconds(cal, intra), 1e9 / 300e9, 1e-12);
  sim::RankBytes both = inter;
  both.sent_intra = 1e9;
  EXPECT_NEAR(sim::all_to_all_seconds(cal, both), link_s, 1e-12);  // the slower half, not the sum
  // Half the link's bandwidth doubles the inter-node bytes' time and leaves the node's alone.
  cal.net_GBps_per_gpu = 25;
  EXPECT_NEAR(sim::all_to_all_seconds(cal, inter), 20e-6 + 1e9 / (25 * 0.8 * 1e9), 1e-12);
  EXPECT_NEAR(sim::all_to_all_seconds(cal, intra), 1e9 / 300e9, 1e-12);
  // Moving a GPU's bytes from across to inside the node makes its exchange faster by the ratio of the rates.
  sim::RankBytes moved;
  moved.sent_intra = 1e9;
  moved.received_intra = 0.5e9;
  EXPECT_LT(sim::all_to_all_seconds(cal, moved), sim::all_to_all_seconds(cal, inter) / 10);

  // In a rank's time: 2 passes per layer, each the exchange above (no ping-pong: nothing hidden).
  const sim::ModelShape shape = sim::model_preset("llama-8b");
  const sim::Layout layout{16, 8, 1, 1};
  sim::RankWork w;
  w.tokens = 4096;
  w.bytes = inter;
  const sim::RankTime t = sim::rank_time(w, shape, layout, cal, false);
  EXPECT_NEAR(t.comm, static_cast<double>(shape.layers) * 2 * (20e-6 + 1e9 / 20e9), 1e-9);
  // Two ranks of one group with the same total inter-node bytes, split 90/10 or 50/50: the group's step is the
  // slower rank's, so the skewed split is slower though it moves no more bytes.
  auto step_of = [&](double share) {
    std::vector<std::vector<double>> times(1);
    for (double part : {share, 1 - share}) {
      sim::RankWork r = w;
      r.bytes = sim::RankBytes{};
      r.bytes.sent_inter = r.bytes.received_inter = 2e9 * part;
      times[0].push_back(sim::rank_time(r, shape, layout, cal, false).total);
    }
    return sim::step_seconds(times, 2, 1);
  };
  EXPECT_GT(step_of(0.9), step_of(0.5) + static_cast<double>(shape.layers) * 2 * 0.7e9 / 20e9);
}

// --nic-share node (Layout::rail_routed): 4 ranks in 2 nodes of 2, rails 0 and 1 in each node, by hand.
TEST(SimulateNetwork, RailRoutingSendsOverTheDestinationsRail) {
  sim::Layout layout{4, 2, 1, 1};
  layout.rail_routed = true;
  std::vector<int64_t> link(16, 0);
  auto at = [&](int src, int dst) -> int64_t& { return link[static_cast<size_t>(src * 4 + dst)]; };
  at(0, 2) = 100;  // rail 0 -> rail 0: rank 0's own NIC
  at(0, 3) = 50;   // rail 0 -> rail 1: relayed over NVLink to rank 1, out of rank 1's NIC
  at(1, 3) = 10;   // rail 1 -> rail 1: rank 1's own NIC
  at(2, 0) = 7;
  at(0, 1) = 5;    // inside node 0: stays intra, no NIC
  std::vector<sim::RankWork> work(4);
  for (size_t r = 0; r < 4; ++r) {  // what rank_work gives before routing (the own-NIC split)
    work[r].bytes.received_inter = 1000.0 + static_cast<double>(r);
  }
  work[0].bytes.sent_inter = 150;
  work[0].bytes.sent_intra = 5;
  work[1].bytes.received_intra = 5;
  work[1].bytes.sent_inter = 10;
  work[2].bytes.sent_inter = 7;
  sim::route_by_rail(link, 4, layout, 0, work);
  EXPECT_DOUBLE_EQ(work[0].bytes.sent_inter, 100);
  EXPECT_DOUBLE_EQ(work[1].bytes.sent_inter, 60);
  EXPECT_DOUBLE_EQ(work[2].bytes.sent_inter, 7);
  EXPECT_DOUBLE_EQ(work[3].bytes.sent_inter, 0);
  EXPECT_DOUBLE_EQ(work[0].bytes.sent_intra, 5 + 50);      // the relay hop
  EXPECT_DOUBLE_EQ(work[1].bytes.received_intra, 5 + 50);
  for (size_t r = 0; r < 4; ++r) EXPECT_DOUBLE_EQ(work[r].bytes.received_inter, 1000.0 + static_cast<double>(r));

  // Through the whole model with a real plan (4 nodes of 4): the same bytes leave the nodes, the busiest NIC
  // carries less than the busiest GPU sent across over its own (its node's bytes spread over the rails), and the
  // relay hops add NVLink bytes.
  sim::Scenario s = short_and_long_documents();
  const auto rates = sim::constant_rates(600, 400, 2.5);
  const sim::SystemCalibration cal = sim::testing::calibration(500, 4000, 48, {{1e6, 10}, {1e9, 300}});
  s.layout = sim::Layout{16, 4, 1, 1};
  const sim::BalancerResult own = sim::simulate(s, cal, *rates).at(0);
  s.layout.rail_routed = true;
  const sim::BalancerResult rail = sim::simulate(s, cal, *rates).at(0);
  EXPECT_NEAR(rail.bytes_inter_per_layer, own.bytes_inter_per_layer, 1e-9 * own.bytes_inter_per_layer);
  ASSERT_GT(own.max_inter_sent_per_gpu, 0);
  EXPECT_LT(rail.max_inter_sent_per_gpu, own.max_inter_sent_per_gpu);
  EXPECT_GT(rail.bytes_intra_per_layer, own.bytes_intra_per_layer);  // the relay hops cross NVLink
}
