// The step model's arithmetic on small cases checked by hand: FLOPs per token, layouts, the comm curve,
// attention seconds per shard, a rank's time with and without ping-pong and tensor parallelism, and
// the step's composition over groups, micro-batches and pipeline stages.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <stdexcept>
#include <string>

#include "attention_rates.h"
#include "calibration_fixture.h"
#include "comm_model.h"
#include "layout.h"
#include "model_shape.h"
#include "step_model.h"
#include "system_calibration.h"

namespace sim = cad::simulate;

namespace {

// layers 2, hidden 4, heads 2, kv 1, D 2, mlp 8, vocab 10.
sim::ModelShape tiny() { return {"tiny", 2, 4, 2, 1, 2, 8, 10}; }

// NVLink curve (1e6 B, 10 GB/s), (1e8 B, 100 GB/s); GEMM 1 TFLOP/s; no element-wise work unless a test
// sets it.
sim::SystemCalibration calibration() { return sim::testing::calibration(1, 1, 0, {{1e6, 10}, {1e8, 100}}); }

// A rate that depends on the shard's shape, to see that each shard is looked up on its own.
class QRates final : public sim::AttentionRates {
 public:
  double fwd_tflops(int64_t q, int64_t) const override { return static_cast<double>(q); }
  double bwd_tflops(int64_t, int64_t kv) const override { return static_cast<double>(kv); }
  double backward_flop_ratio() const override { return 2.5; }
  int64_t head_dim() const override { return 0; }
  std::string describe() const override { return "q/kv"; }
};

template <typename F>
std::string refusal(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SimulateModel, LinearFlopsPerToken) {
  // qkv 4*(2+2)*2 = 32, out 2*2*4 = 16, mlp 3*4*8 = 96 multiply-adds -> 2 * 144 FLOPs.
  EXPECT_DOUBLE_EQ(tiny().linear_flops_per_token_layer(), 288.0);
  EXPECT_DOUBLE_EQ(tiny().head_flops_per_token(), 80.0);
  // Llama-3-8B: 6.98e9 parameters outside embeddings and head -> 2 FLOPs each per token.
  const sim::ModelShape l = sim::model_preset("llama-8b");
  EXPECT_NEAR(l.linear_flops_per_token_layer() * static_cast<double>(l.layers), 2 * 6.98e9, 0.01e9 * 2);
  EXPECT_NE(refusal([] { sim::model_preset("70b"); }).find("unknown model preset '70b' (known: llama-8b, 34b)"),
            std::string::npos);
}

TEST(SimulateModel, ShapeRefusals) {
  sim::ModelShape s = tiny();
  s.kv_heads = 3;
  EXPECT_NE(refusal([&] { sim::validate(s); }).find("heads (2) must be a multiple of kv_heads (3)"), std::string::npos);
  s = tiny();
  s.mlp = 0;
  EXPECT_NE(refusal([&] { sim::validate(s); }).find("mlp must be >= 1"), std::string::npos);
}

TEST(SimulateModel, LayoutAndNodes) {
  const sim::ModelShape l = sim::model_preset("llama-8b");
  sim::Layout ok{64, 8, 2, 2};
  EXPECT_NO_THROW(sim::validate(ok, l));
  EXPECT_EQ(ok.dp(), 16);
  EXPECT_EQ(ok.node_of(3), 0);  // GPUs 6, 7
  EXPECT_EQ(ok.node_of(4), 1);  // GPUs 8, 9
  EXPECT_EQ(sim::heads_per_gpu(ok, l), 16);
  EXPECT_EQ(sim::kv_heads_per_gpu(ok, l), 4);
  EXPECT_EQ(sim::kv_heads_per_gpu(sim::Layout{64, 8, 8, 1}, sim::model_preset("34b")), 1);
  EXPECT_EQ(sim::kv_heads_per_gpu(sim::Layout{64, 16, 16, 1}, sim::ModelShape{"x", 1, 64, 32, 8, 2, 1, 0}), 1);

  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{12, 8, 8, 1}, l); }).find("--gpus 12 is not a multiple of --tp x --pp = 8"),
            std::string::npos);
  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{32, 8, 16, 1}, l); }).find("--tp 16 must divide --gpus-per-node 8"),
            std::string::npos);
  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{36, 6, 3, 1}, l); }).find("does not divide the model's heads (32)"),
            std::string::npos);
  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{96, 8, 1, 3}, l); }).find("does not divide the model's layers (32)"),
            std::string::npos);
  sim::ModelShape six_kv{"x", 4, 48, 24, 6, 2, 1, 0};
  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{8, 8, 4, 1}, six_kv); }).find("kv_heads (6) must divide one another"),
            std::string::npos);
  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{0, 8, 1, 1}, l); }).find("--gpus must be >= 1"), std::string::npos);
  // tp * pp = 2^64 wrapped to 0 and the divisibility check died of SIGFPE: refused before multiplying.
  const int64_t huge = int64_t{1} << 32;
  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{64, 8, huge, huge}, l); }).find("--tp 4294967296 x --pp 4294967296 is more than --gpus 64"),
            std::string::npos);
  EXPECT_NE(refusal([&] { sim::validate(sim::Layout{64, 8, 8, 16}, l); }).find("is more than --gpus 64"), std::string::npos);
}

TEST(SimulateModel, CommCurveAndNetwork) {
  const sim::SystemCalibration c = calibration();
  EXPECT_EQ(sim::intra_node_seconds(c, 0), 0);
  EXPECT_DOUBLE_EQ(sim::intra_node_seconds(c, 1e6), 1e-4);        // on the first point
  EXPECT_DOUBLE_EQ(sim::intra_node_seconds(c, 1e3), 1e-4);        // below it: the first call's time
  EXPECT_NEAR(sim::intra_node_seconds(c, 1e7), 1e7 / 55e9, 1e-12);  // halfway in log(bytes): 55 GB/s
  EXPECT_DOUBLE_EQ(sim::intra_node_seconds(c, 1e9), 1e-2);        // past the last point: 100 GB/s
  EXPECT_NEAR(sim::inter_node_seconds(c, 4e9), 20e-6 + 0.1, 1e-12);
  sim::RankBytes b;
  b.sent_intra = 1e6;
  b.received_intra = 1e8;   // 1 ms inside the node
  b.sent_inter = 4e6;       // 0.12 ms over the network
  EXPECT_DOUBLE_EQ(sim::all_to_all_seconds(c, b), 1e-3);
  b.received_inter = 4e8;   // 10.02 ms
  EXPECT_NEAR(sim::all_to_all_seconds(c, b), 20e-6 + 1e-2, 1e-12);
}

TEST(SimulateModel, AttentionSecondsPerShard) {
  const QRates rates;
  // 2 heads x D 8: 64 FLOPs per score entry. Shard A: q 4, kv 4, 10 entries = 640 FLOPs at 4 TFLOP/s
  // forward, 1600 backward FLOPs at 4 TFLOP/s; shard B: q 2, kv 8, 15 entries = 960 FLOPs at 2, 2400 at 8.
  const sim::AttentionSeconds a = sim::attention_seconds({{4, 4, 10}, {2, 8, 15}, {1, 1, 0}}, 2, 8, rates);
  EXPECT_DOUBLE_EQ(a.fwd_flops, 1600);
  EXPECT_NEAR(a.fwd, 640 / 4e12 + 960 / 2e12, 1e-24);
  EXPECT_NEAR(a.bwd, 1600 / 4e12 + 2400 / 8e12, 1e-24);
}

// A measured table with "backward_tiles": the simulator prices a shard's backward by its tile pairs
// (planning/tile_pairs.h), per query head, and its forward by the grid.
TEST(SimulateModel, AttentionSecondsBackwardByTilePairs) {
  const std::string path = ::testing::TempDir() + "pairs_rates.json";
  const std::string r = R"({"tflops": 100, "source": "t"})";
  std::ofstream(path) << R"({"gpu": "t", "head_dim": 8, "backward_flop_ratio": 2.5,
    "dense": {"len": 64, "fwd": )" << r << R"(, "bwd": )" << r << R"(}, "q_lens": [64], "kv_lens": [64],
    "grid": [{"q": 64, "kv": 64, "fwd": )" << r << R"(, "bwd": )" << r << R"(}],
    "backward_tiles": {"block_m": 64, "block_n": 128, "full_pair_us": 1, "partial_pair_us": 3, "source": "t"}})";
  const auto rates = sim::load_attention_rates(path);
  // Causal tail shard q 256 on kv 512: 10 full + 4 partial pairs = 22 us per head; 2 heads. Non-causal
  // 200 x 300: 6 full + 6 partial = 24 us per head.
  sim::Shard tail{256, 512, 256 * 512 - 256 * 255 / 2};
  sim::Shard full{200, 300, 200 * 300};
  full.causal = false;
  const sim::AttentionSeconds a = sim::attention_seconds({tail, full}, 2, 8, *rates);
  EXPECT_NEAR(a.bwd, 2 * (22 + 24) * 1e-6, 1e-15);
  EXPECT_NEAR(a.fwd, a.fwd_flops / 100e12, 1e-18);
}

TEST(SimulateModel, RankTimeByHand) {
  const sim::ModelShape s = tiny();
  const sim::SystemCalibration c = calibration();
  sim::RankWork w;
  w.tokens = 1000;                 // linear forward per layer: 1000 * 288 / 1e12 = 2.88e-7 s
  w.attention.fwd = 1e-4;          // per layer
  w.attention.bwd = 5e-4;
  w.bytes.sent_intra = 1e6;        // 1e-4 s per pass
  const double lin = 2.88e-7, head = 3 * 1000 * 80 / 1e12;
  const sim::Layout one{1, 8, 1, 1};

  const sim::RankTime off = sim::rank_time(w, s, one, c, false);
  EXPECT_NEAR(off.linear, 2 * (lin + 2 * lin) + head, 1e-15);
  EXPECT_NEAR(off.attention, 2 * 6e-4, 1e-15);
  EXPECT_NEAR(off.comm, 2 * 2e-4, 1e-15);
  EXPECT_NEAR(off.total, 2 * ((lin + 1e-4 + 1e-4) + (2 * lin + 5e-4 + 1e-4)) + head, 1e-15);
  EXPECT_NEAR(off.comm_exposed, off.comm, 1e-15);

  // Ping-pong: the forward pass is comm-bound (1e-4 vs 1e-4 + lin), the backward compute-bound.
  w.bytes.sent_intra = 5e6;  // 5e6 B at 41.5 GB/s (log interpolation) -> 1.21e-4 s
  const double comm = 5e6 / ((10 + (100 - 10) * std::log(5.0) / std::log(100.0)) * 1e9);
  const sim::RankTime on = sim::rank_time(w, s, one, c, true);
  EXPECT_NEAR(on.total, 2 * (comm + (2 * lin + 5e-4)) + head, 1e-15);
  EXPECT_NEAR(on.comm_exposed, 2 * (comm - (lin + 1e-4)), 1e-15);

  // Tensor parallelism: linear work halves; 4 collectives of 1000 tokens * 4 * 2 bytes * 1/2 per pass,
  // each below the curve's first point (1e-4 s), never hidden.
  const sim::RankTime tp = sim::rank_time(w, s, sim::Layout{2, 8, 2, 1}, c, true);
  EXPECT_NEAR(tp.linear, off.linear / 2, 1e-15);
  EXPECT_NEAR(tp.tp_comm, 2 * 2 * 4 * 1e-4, 1e-15);
  EXPECT_NEAR(tp.total, 2 * (comm + (lin + 5e-4) + 8e-4) + head / 2, 1e-15);

  // Element-wise work: 1000 tokens x 4 hidden x 3 bytes at 1 GB/s = 1.2e-5 s forward, twice backward.
  sim::SystemCalibration ew = c;
  ew.elementwise_bytes_per_token_layer_per_hidden = 3;
  EXPECT_NEAR(sim::rank_time(w, s, one, ew, false).linear - off.linear, 2 * 3 * 1.2e-5, 1e-15);

  // Pipeline: two stages of one layer each.
  EXPECT_NEAR(sim::rank_time(w, s, sim::Layout{2, 8, 1, 2}, c, false).attention, off.attention / 2, 1e-15);
}

TEST(SimulateModel, StepComposition) {
  const std::vector<std::vector<double>> t = {{1, 2, 3, 4}, {4, 1, 1, 1}};
  EXPECT_DOUBLE_EQ(sim::step_seconds(t, 1, 1), 5);   // rank sums 5, 3, 4, 5: data parallelism alone
  EXPECT_DOUBLE_EQ(sim::step_seconds(t, 2, 1), 6);   // groups {0,1}: 2 + 4, {2,3}: 4 + 1
  EXPECT_DOUBLE_EQ(sim::step_seconds(t, 4, 1), 8);   // one group: 4 + 4
  EXPECT_DOUBLE_EQ(sim::step_seconds(t, 2, 2), 10);  // + (pp - 1) x slowest micro-batch: 6 + 4, 5 + 4
  EXPECT_DOUBLE_EQ(sim::step_seconds(t, 3, 1), 7);   // {0,1,2}: 3 + 4, {3}: 4 + 1
  EXPECT_THROW(sim::step_seconds({}, 1, 1), std::invalid_argument);
  EXPECT_THROW(sim::step_seconds({{1, 2}, {1}}, 1, 1), std::invalid_argument);
}
