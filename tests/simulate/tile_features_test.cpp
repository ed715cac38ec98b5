// bench/simulate/tile_features.h: the Hopper kernels' tile counts and forward schedule of a server batch,
// checked by hand on small segments (what cad_simulate_server_check --per-rank prints).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tile_features.h"

namespace {

using cad::simulate::check::fwd_schedule;
using cad::simulate::check::FwdSchedule;
using cad::simulate::check::tile_features;
using cad::simulate::check::TileFeatures;

cad_segment_v1_t segment(int64_t q_len, int64_t kv_len) { return {0, q_len, 0, kv_len}; }

// The tile counts of one segment (one head, one KV group), checked against the hand count.
struct Counts {
  int64_t q_tiles, fwd_full, fwd_partial, bwd_k_tiles, bwd_full, bwd_partial;
};
void expect_counts(int64_t q_len, int64_t kv_len, const Counts& want) {
  SCOPED_TRACE("segment q " + std::to_string(q_len) + ", kv " + std::to_string(kv_len));
  const TileFeatures f = tile_features({segment(q_len, kv_len)}, 1, 1, 132);
  EXPECT_EQ(f.segments, 1);
  EXPECT_EQ(f.q_tiles, want.q_tiles);
  EXPECT_EQ(f.fwd_full, want.fwd_full);
  EXPECT_EQ(f.fwd_partial, want.fwd_partial);
  EXPECT_EQ(f.bwd_k_tiles, want.bwd_k_tiles);
  EXPECT_EQ(f.bwd_full, want.bwd_full);
  EXPECT_EQ(f.bwd_partial, want.bwd_partial);
}

TEST(TileFeatures, DenseCausalTileIsAllDiagonal) {
  // 128 queries on 128 keys: one forward pair, cut by the diagonal; the backward's key tile meets two
  // 64-query blocks, both cut (query 64 sees keys <= 64 only).
  expect_counts(128, 128, {1, 0, 1, 1, 0, 2});
  EXPECT_DOUBLE_EQ(tile_features({segment(128, 128)}, 1, 1, 132).fwd_flops_per_head, 128.0 * 128 - 128.0 * 127 / 2);
}

TEST(TileFeatures, TailShardHasFullTilesLeftOfTheDiagonal) {
  // The last 128 queries of a 384-token document: query 0 sees keys <= 256, so key tiles [0,128) and
  // [128,256) are full and [256,384) is cut. Backward: key tiles 0 and 1 meet two full blocks each; key
  // tile 2 meets two cut blocks.
  expect_counts(128, 384, {1, 2, 1, 3, 4, 2});
}

TEST(TileFeatures, ShortLastTilesCountAsPartial) {
  // 130 queries on 130 keys: two query tiles (128 + 2 rows). The first sees keys <= 127: one cut pair;
  // the second (2 rows) sees 130 keys: two pairs, both partly empty. Backward: key tile 0 meets blocks of
  // 64, 64 and 2 queries (two cut by the diagonal, one short); key tile 1 (2 keys) meets one block.
  expect_counts(130, 130, {2, 0, 3, 2, 0, 4});
}

TEST(TileFeatures, SegmentsAddUp) {
  const TileFeatures a = tile_features({segment(128, 384)}, 1, 1, 132);
  const TileFeatures b = tile_features({segment(130, 130)}, 1, 1, 132);
  const TileFeatures ab = tile_features({segment(128, 384), segment(130, 130)}, 1, 1, 132);
  EXPECT_EQ(ab.segments, 2);
  EXPECT_EQ(ab.q_tiles, a.q_tiles + b.q_tiles);
  EXPECT_EQ(ab.fwd_full + ab.fwd_partial, a.fwd_full + a.fwd_partial + b.fwd_full + b.fwd_partial);
  EXPECT_EQ(ab.bwd_full + ab.bwd_partial, a.bwd_full + a.bwd_partial + b.bwd_full + b.bwd_partial);
}

TEST(FwdSchedule, DealsUnitsHeaviestFirst) {
  // Items of 3 and 1 key tiles (costs 4 and 2 with the unit's overhead), 2 heads, 4 blocks: one round,
  // loads 4 4 2 2. No split: half the longest item is below the 4-tile minimum chunk.
  const FwdSchedule s = fwd_schedule({3, 1}, {0, 0}, 2, 1, 4);
  EXPECT_EQ(s.makespan, 4);
  EXPECT_DOUBLE_EQ(s.mean_load, 3.0);
  EXPECT_EQ(s.splits, 0);
  // K/V streams of the round: (segment 0, head 0) and (segment 0, head 1), 3 tiles each; with the two
  // items in different segments, 3 + 3 + 1 + 1.
  EXPECT_EQ(s.kv_stream_tiles, 6);
  EXPECT_EQ(fwd_schedule({3, 1}, {0, 1}, 2, 1, 4).kv_stream_tiles, 8);
}

TEST(FwdSchedule, SplitsALoneLongItemLikeThePlanner) {
  // One item of 64 key tiles, one head, 4 blocks: whole it takes 65 steps against a bound of 17. Chunks
  // of 32 give 35, of 16 give 4 pieces of 16 + 3 = 19 (chosen); 8 gives 2 rounds of 11 = 22, no better.
  const FwdSchedule s = fwd_schedule({64}, {0}, 1, 1, 4);
  EXPECT_EQ(s.splits, 1);
  EXPECT_EQ(s.makespan, 19);
  EXPECT_DOUBLE_EQ(s.mean_load, 19.0);
}

}  // namespace
