// tile_pairs_test.cpp -- the backward's (key tile, query step) pairs (planning/tile_pairs.h) by hand
// and against a per-pair walk written here from the definition; the rate table's optional
// "backward_tiles" key (reader, errors naming the key); and the time cost with and without it by hand
// (without it: exactly the old rule entries x relative_time, so existing tables plan as before).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "plan_time.h"
#include "rate_table.h"
#include "tile_pairs.h"

namespace {

using cad::plan::backward_tile_pairs;
using cad::plan::TilePairs;

// The definition, one pair at a time: key tiles of n keys from 0; per tile the query steps of m queries
// start at the first query that sees the tile's first key; a pair is full when the tile has n keys,
// the step m queries, and (causal) the step's first query sees the tile's last key.
TilePairs walk_pairs(int64_t q, int64_t kv, bool causal, int64_t m, int64_t n) {
  TilePairs out;
  const int64_t offset = causal ? kv - q : 0;
  for (int64_t k0 = 0; k0 < kv; k0 += n) {
    const int64_t keys = std::min(n, kv - k0);
    const int64_t first = causal ? std::clamp<int64_t>(k0 - offset, 0, q) : 0;
    for (int64_t s = first; s < q; s += m) {
      const bool full = keys == n && std::min(m, q - s) == m && (!causal || s + offset >= k0 + keys - 1);
      ++(full ? out.full : out.partial);
    }
  }
  return out;
}

void expect_pairs(int64_t q, int64_t kv, bool causal, int64_t full, int64_t partial) {
  const TilePairs p = backward_tile_pairs(q, kv, causal, 64, 128);
  EXPECT_EQ(p.full, full) << "q " << q << " kv " << kv << (causal ? " causal" : " non-causal");
  EXPECT_EQ(p.partial, partial) << "q " << q << " kv " << kv << (causal ? " causal" : " non-causal");
}

TEST(TilePairs, HandCheckedShards) {
  // A whole 128-token document: one tile, two steps, both cut by the diagonal.
  expect_pairs(128, 128, true, 0, 2);
  // A whole 256-token document: tile 0 has 4 steps (2 cut, 2 full), tile 1 starts at query 128: 2 steps, both cut.
  expect_pairs(256, 256, true, 2, 4);
  // The causal tail shard [256, 512) of a 512-token document (q 256, kv 512): tiles 0-1 lie left of the
  // diagonal (4 full steps each), tile 2 (keys 256-383) 2 cut + 2 full, tile 3 starts at query 128: 2 cut.
  expect_pairs(256, 512, true, 10, 4);
  // Non-causal 200 x 300: 3 tiles (the last 44 keys) x 4 steps (the last 8 queries); full 2 x 3.
  expect_pairs(200, 300, false, 6, 6);
  // q not a multiple of 64: 100 queries on 356 keys (a tail shard): tiles 0-1 left of the diagonal have
  // a full step and a 36-query one; tile 2 holds 100 keys (short): both its steps partial.
  expect_pairs(100, 356, true, 2, 4);
  expect_pairs(100, 100, true, 0, 2);
  // kv not a multiple of 128: 128 queries on 200 keys (offset 72). Tile 0 straddles: step 0's first query
  // sees keys <= 72 < 127 (cut), step 1's sees <= 136 (full). Tile 1 (72 keys, short) starts at query 56:
  // 2 partial steps.
  expect_pairs(128, 200, true, 1, 3);
  expect_pairs(1, 1, true, 0, 1);
  expect_pairs(0, 100, true, 0, 0);
}

TEST(TilePairs, ClosedFormEqualsThePerPairWalk) {
  // The kernel's tiles around its edges: q and kv at, one below and one above multiples of 64 and 128.
  for (int64_t q : {1, 63, 64, 65, 128, 200, 1000, 4097}) {
    for (int64_t extra : {0, 1, 72, 127, 128, 129, 5000}) {
      const TilePairs got = backward_tile_pairs(q, q + extra, true, 64, 128);
      const TilePairs want = walk_pairs(q, q + extra, true, 64, 128);
      EXPECT_TRUE(got.full == want.full && got.partial == want.partial) << "q " << q << " kv " << q + extra;
    }
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    const int64_t q = 1 + static_cast<int64_t>(rng() % 1500);
    const int64_t kv = q + (rng() % 3 ? static_cast<int64_t>(rng() % 2000) : 0);
    const bool causal = rng() % 4 != 0;
    const int64_t m = rng() % 2 ? 64 : 32, n = m * (1 + static_cast<int64_t>(rng() % 3));
    const TilePairs got = backward_tile_pairs(q, kv, causal, m, n), want = walk_pairs(q, kv, causal, m, n);
    ASSERT_TRUE(got.full == want.full && got.partial == want.partial)
        << "q " << q << " kv " << kv << " causal " << causal << " m " << m << " n " << n << ": " << got.full << "/"
        << got.partial << " vs walk " << want.full << "/" << want.partial;
  }
}

std::string rate(double tflops) { return R"({"tflops": )" + std::to_string(tflops) + R"(, "source": "test"})"; }

// rate_table_test.cpp's 2x2 table (dense 400 / 200), with an optional "backward_tiles" value.
std::string table(const std::string& backward_tiles = "") {
  return R"({"gpu": "test", "head_dim": 128, "backward_flop_ratio": 2.5,
    "dense": {"len": 10000, "fwd": )" + rate(400) + R"(, "bwd": )" + rate(200) + R"(},
    "q_lens": [100, 10000], "kv_lens": [100, 10000], "grid": [
      {"q": 100, "kv": 100, "fwd": )" + rate(100) + R"(, "bwd": )" + rate(50) + R"(},
      {"q": 100, "kv": 10000, "fwd": )" + rate(300) + R"(, "bwd": )" + rate(150) + R"(},
      {"q": 10000, "kv": 100, "fwd": )" + rate(200) + R"(, "bwd": )" + rate(100) + R"(},
      {"q": 10000, "kv": 10000, "fwd": )" + rate(400) + R"(, "bwd": )" + rate(200) + "}]" +
         (backward_tiles.empty() ? "" : R"(, "backward_tiles": )" + backward_tiles) + "}";
}

const std::string kTiles =
    R"({"block_m": 64, "block_n": 128, "full_pair_us": 0.02, "partial_pair_us": 0.06, "source": "test"})";

TEST(BackwardTiles, ReadAndPricedByHand) {
  const cad::plan::RateTable t = cad::plan::parse_rate_table(table(kTiles), "tiles.json");
  ASSERT_TRUE(t.has_backward_tiles);
  EXPECT_EQ(t.backward_tiles.block_m, 64);
  EXPECT_EQ(t.backward_tiles.block_n, 128);
  EXPECT_EQ(t.backward_tiles.source, "test");
  EXPECT_FALSE(cad::plan::parse_rate_table(table(), "plain.json").has_backward_tiles);

  cad::plan::ModelParams m;  // Hq 32, D 128, causal
  // A whole 100-token document: 5050 entries; forward at the (100, 100) corner, 100 TFLOP/s; backward
  // 0 full + 2 partial pairs = 0.12 us per head, 32 heads.
  const double flops = 5050.0 * 4 * 128 * 32;
  EXPECT_NEAR(cad::plan::task_seconds(0, 100, 100, m, t), flops / 100e12 + 32 * 0.12e-6, 1e-15);
  // In dense entries: one head's entry at the dense rate takes 4 x 128 FLOPs x (1/400 + 2.5/200) / 1e12
  // = 7.68e-12 s, so 0.12 us = 15625 entries; the forward weighs 5050 x (1/100) / (1/400 + 2.5/200).
  EXPECT_EQ(cad::plan::time_weighted_cost(0, 100, 100, true, t), std::llround(5050.0 / 1.5 + 15625.0));
  // Non-causal: 64 queries of a 10000-token document see all 10000 keys: forward at (100, 10000), 300
  // TFLOP/s; 79 key tiles x 1 step, 78 full (the last tile holds 16 keys): 78 x 0.02 + 0.06 = 1.62 us.
  m.causal = false;
  const double nc_flops = 64.0 * 10000 * 4 * 128 * 32;
  EXPECT_NEAR(cad::plan::task_seconds(0, 64, 10000, m, t), nc_flops / 300e12 + 32 * 1.62e-6, 1e-15);
  // Without the key the backward is FLOPs / the bwd rate (50 TFLOP/s at the corner).
  const cad::plan::RateTable plain = cad::plan::parse_rate_table(table(), "plain.json");
  m.causal = true;
  EXPECT_NEAR(cad::plan::task_seconds(0, 100, 100, m, plain), flops / 100e12 + 2.5 * flops / 50e12, 1e-15);
}

void expect_error(const std::string& tiles, const std::string& needle) {
  try {
    cad::plan::parse_rate_table(table(tiles), "bad.json");
    ADD_FAILURE() << "accepted " << tiles;
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST(BackwardTiles, ErrorsNameTheKey) {
  expect_error(R"("fast")", "'backward_tiles' must be an object");
  expect_error(R"({"block_m": 64, "block_n": 128, "partial_pair_us": 0.06, "source": "x"})",
               "'backward_tiles.full_pair_us' is missing");
  expect_error(R"({"block_m": 64, "block_n": 100, "full_pair_us": 0.02, "partial_pair_us": 0.06, "source": "x"})",
               "'backward_tiles.block_n' = 100 must be a multiple of block_m = 64");
  expect_error(R"({"block_m": 0, "block_n": 128, "full_pair_us": 0.02, "partial_pair_us": 0.06, "source": "x"})",
               "'backward_tiles.block_m'");
  expect_error(R"({"block_m": 64, "block_n": 128, "full_pair_us": 0.02, "partial_pair_us": 0, "source": "x"})",
               "'backward_tiles.partial_pair_us'");
  expect_error(R"({"block_m": 64, "block_n": 128, "full_pair_us": 0.02, "partial_pair_us": 0.06})",
               "'backward_tiles.source'");
}

// Without "backward_tiles" the cost is exactly what it was before the key existed: entries x
// relative_time(q, kv), rounded -- so a table without the key gives the plans it gave before.
TEST(BackwardTiles, WithoutTheKeyTheCostIsTheOldRule) {
  const cad::plan::RateTable t = cad::plan::load_rate_table(CAD_SOURCE_DIR "/configs/calibration/h200.json");
  ASSERT_FALSE(t.has_backward_tiles);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const int64_t len = 1 + static_cast<int64_t>(rng() % 300000);
    const int64_t b = static_cast<int64_t>(rng() % static_cast<uint64_t>(len));
    const int64_t e = b + 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(len - b));
    const bool causal = rng() % 4 != 0;
    const int64_t entries = cad::plan::task_cost(b, e, len, causal);
    const int64_t old = std::llround(static_cast<double>(entries) * t.relative_time(e - b, causal ? e : len));
    ASSERT_EQ(cad::plan::time_weighted_cost(b, e, len, causal, t), old) << "[" << b << ", " << e << ") of " << len;
  }
}

}  // namespace
