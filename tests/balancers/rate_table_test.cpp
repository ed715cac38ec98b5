// The kernel-rate table reader (planning/rate_table.h): interpolation by hand, clamping, the
// seeded H200 table, and errors that name the file and the key.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "rate_table.h"

namespace {

using cad::plan::parse_rate_table;
using cad::plan::RateTable;

std::string rate(double tflops) { return R"({"tflops": )" + std::to_string(tflops) + R"(, "source": "test"})"; }

// A 2x2 grid on q, kv in {100, 10000}: in log space 1000 is exactly half way.
std::string small_table(const std::string& grid_override = "") {
  const std::string grid = grid_override.empty()
                               ? R"([{"q": 100, "kv": 100, "fwd": )" + rate(100) + R"(, "bwd": )" + rate(50) + R"(},
         {"q": 100, "kv": 10000, "fwd": )" + rate(300) + R"(, "bwd": )" + rate(150) + R"(},
         {"q": 10000, "kv": 100, "fwd": )" + rate(200) + R"(, "bwd": )" + rate(100) + R"(},
         {"q": 10000, "kv": 10000, "fwd": )" + rate(400) + R"(, "bwd": )" + rate(200) + R"(}])"
                               : grid_override;
  return R"({"gpu": "test", "head_dim": 128, "backward_flop_ratio": 2.5,
    "dense": {"len": 10000, "fwd": )" + rate(400) + R"(, "bwd": )" + rate(200) + R"(},
    "q_lens": [100, 10000], "kv_lens": [100, 10000], "grid": )" + grid + "}";
}

TEST(RateTable, BilinearInLogSpaceByHand) {
  const RateTable t = parse_rate_table(small_table(), "small.json");
  // Corners are returned exactly.
  EXPECT_DOUBLE_EQ(t.fwd_tflops(100, 10000), 300);
  EXPECT_DOUBLE_EQ(t.bwd_tflops(10000, 100), 100);
  // (1000, 1000) is the middle of the cell in log space: the mean of the four corners.
  EXPECT_NEAR(t.fwd_tflops(1000, 1000), (100 + 300 + 200 + 400) / 4.0, 1e-9);
  EXPECT_NEAR(t.bwd_tflops(1000, 1000), (50 + 150 + 100 + 200) / 4.0, 1e-9);
  // (100, 1000): on the q = 100 edge, half way in kv: (100 + 300) / 2.
  EXPECT_NEAR(t.fwd_tflops(100, 1000), 200, 1e-9);
  // Not linear in the plain lengths: kv = 5050 (the linear midpoint) is 0.8266 of the way in log space.
  EXPECT_NEAR(t.fwd_tflops(100, 5050), 100 + 200 * std::log(50.5) / std::log(100.0), 1e-9);
}

TEST(RateTable, ClampsOutsideTheGrid) {
  const RateTable t = parse_rate_table(small_table(), "small.json");
  EXPECT_DOUBLE_EQ(t.fwd_tflops(1, 1), 100);
  EXPECT_DOUBLE_EQ(t.fwd_tflops(1000000, 1000000), 400);
  EXPECT_NEAR(t.fwd_tflops(1000, 1 << 30), (300 + 400) / 2.0, 1e-9);  // kv clamped to 10000, q half way
  EXPECT_NEAR(t.fwd_tflops(1, 1000), 200, 1e-9);                       // q clamped to 100
}

TEST(RateTable, ShardSecondsByHand) {
  const RateTable t = parse_rate_table(small_table(), "small.json");
  // At (1000, 1000): forward 250 TFLOP/s, backward 125 TFLOP/s. 1e15 forward FLOPs take 4 s forward,
  // and the backward's 2.5e15 FLOPs take 20 s.
  EXPECT_NEAR(t.shard_seconds(1000, 1000, true, 1e15, 32), 4.0 + 20.0, 1e-9);
  // Relative to the dense entry (400 / 200): (1/250 + 2.5/125) / (1/400 + 2.5/200) = 0.024 / 0.015.
  EXPECT_NEAR(t.relative_time(1000, 1000), 1.6, 1e-12);
  EXPECT_NEAR(t.relative_time(10000, 10000), 1.0, 1e-12);
}

TEST(RateTable, SeededH200TableIsCompleteAndSourced) {
  const RateTable t = cad::plan::load_rate_table(CAD_SOURCE_DIR "/configs/calibration/h200.json");
  EXPECT_EQ(t.head_dim, 128);
  EXPECT_EQ(t.fwd.size(), t.q_lens.size() * t.kv_lens.size());
  for (size_t i = 0; i < t.fwd.size(); ++i) {
    EXPECT_FALSE(t.fwd[i].source.empty());
    EXPECT_FALSE(t.bwd[i].source.empty());
  }
  // Measured points of docs/kernels.md come back exactly.
  EXPECT_DOUBLE_EQ(t.fwd_tflops(16384, 16384), 701);
  EXPECT_DOUBLE_EQ(t.bwd_tflops(16384, 16384), 480);
  EXPECT_DOUBLE_EQ(t.bwd_tflops(128, 131072), 365);
  EXPECT_DOUBLE_EQ(t.dense_bwd.tflops, 480);
  // The point of the table: a 128-query shard on a long prefix runs its backward well below dense.
  EXPECT_LT(t.bwd_tflops(128, 100000), 0.8 * t.dense_bwd.tflops);
}

void expect_error(const std::string& json, const std::string& needle) {
  try {
    parse_rate_table(json, "bad.json");
    ADD_FAILURE() << "accepted a table that should name " << needle;
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(RateTable, ErrorsNameTheFileAndKey) {
  expect_error("[1, 2]", "top level");
  expect_error("{", "not valid JSON");
  std::string t = small_table();
  expect_error(std::string(t).replace(t.find("\"head_dim\": 128"), 15, "\"head_dim\": 0"), "'head_dim'");
  expect_error(std::string(t).replace(t.find("[100, 10000], \"grid\""), 12, "[10000, 100]"), "'kv_lens[1]'");
  // A missing cell is named by its (q, kv).
  const std::string three = R"([{"q": 100, "kv": 100, "fwd": )" + rate(1) + R"(, "bwd": )" + rate(1) + R"(},
      {"q": 100, "kv": 10000, "fwd": )" + rate(1) + R"(, "bwd": )" + rate(1) + R"(},
      {"q": 10000, "kv": 100, "fwd": )" + rate(1) + R"(, "bwd": )" + rate(1) + "}]";
  expect_error(small_table(three), "(10000, 10000)");
  // A rate without a source, a zero rate, an off-grid q, a repeated cell.
  expect_error(small_table(R"([{"q": 100, "kv": 100, "fwd": {"tflops": 5}, "bwd": )" + rate(1) + "}]"),
               "'grid[0].fwd.source'");
  expect_error(small_table(R"([{"q": 100, "kv": 100, "fwd": {"tflops": 0, "source": "x"}, "bwd": )" + rate(1) + "}]"),
               "'grid[0].fwd.tflops'");
  expect_error(small_table(R"([{"q": 7, "kv": 100, "fwd": )" + rate(1) + R"(, "bwd": )" + rate(1) + "}]"),
               "'grid[0].q'");
  const std::string cell = R"({"q": 100, "kv": 100, "fwd": )" + rate(1) + R"(, "bwd": )" + rate(1) + "}";
  expect_error(small_table("[" + cell + ", " + cell + "]"), "'grid[1]' repeats");
  EXPECT_THROW(cad::plan::load_rate_table("/nonexistent/rates.json"), std::invalid_argument);
}

}  // namespace
