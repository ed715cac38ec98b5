// cad_measure_rate_table's CPU half (bench/kernels/rate_grid.h): the batch each shape is timed on, the
// number of shards, the q > kv cells, and the table it writes, read back with the balancers' own reader
// (planning/rate_table.h).
#include "rate_grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rate_table.h"

namespace {

using cad::rates::GridSpec;
using cad::rates::Measurement;
using cad::rates::Shape;

// Causal forward FLOPs of the last q queries of a document of kv tokens, counted here by hand: query j
// (0-based) of the shard sees kv - q + j + 1 keys; 4 * D FLOPs per score entry and query head.
double hand_flops(int64_t q, int64_t kv, const GridSpec& spec) {
  double entries = 0;
  for (int64_t j = 0; j < q; ++j) entries += static_cast<double>(kv - q + j + 1);
  return 4.0 * spec.head_dim * spec.hq * entries;
}

void expect_shard_batch(const Shape& s, const GridSpec& spec) {
  SCOPED_TRACE("shape " + cad::rates::to_string(s));
  const int64_t n = cad::rates::shards_for(s, spec);
  const cad::rates::ShardBatch b = cad::rates::make_batch(s, n, spec);
  ASSERT_EQ(b.n, n);
  ASSERT_EQ(static_cast<int64_t>(b.segments.size()), n);
  EXPECT_EQ(b.tq, n * s.q);
  EXPECT_EQ(b.tk, n * s.kv);
  for (size_t i = 0; i < b.segments.size(); ++i) {
    const cad_segment_v1_t& g = b.segments[i];
    EXPECT_EQ(g.q_len, s.q);
    EXPECT_EQ(g.kv_len, s.kv);
    // Bottom-right causal: the last query sees keys [0, kv_len - q_len + q_len - 1], i.e. all kv of them.
    EXPECT_EQ(g.kv_len - g.q_len + (g.q_len - 1) + 1, s.kv);
    EXPECT_GE(g.q_offset, 0);
    EXPECT_GE(g.kv_offset, 0);
    EXPECT_LE(g.q_offset + g.q_len, b.tq);
    EXPECT_LE(g.kv_offset + g.kv_len, b.tk);
    if (i > 0) {  // every shard has its own queries and its own document's keys
      EXPECT_GE(g.q_offset, b.segments[i - 1].q_offset + b.segments[i - 1].q_len);
      EXPECT_GE(g.kv_offset, b.segments[i - 1].kv_offset + b.segments[i - 1].kv_len);
    }
  }
  EXPECT_NEAR(b.forward_flops, static_cast<double>(n) * hand_flops(s.q, s.kv, spec), 1e-9 * b.forward_flops);
}

TEST(RateGrid, EveryTimedShapeIsABatchOfIdenticalTailShards) {
  const GridSpec spec;
  for (const cad::rates::PlannedShape& p : cad::rates::shapes_to_time(spec)) expect_shard_batch(p.shape, spec);
  GridSpec gqa;
  gqa.hq = 16;
  gqa.hkv = 2;
  gqa.head_dim = 64;
  expect_shard_batch({100, 3000}, gqa);
}

TEST(RateGrid, ShardFlopsAreTheTablesConvention) {
  const GridSpec spec;  // 4 * 128 * 32 = 16384 FLOPs per score entry
  // (128, 1024): 128*1024 - 128*127/2 = 122944 entries.
  EXPECT_DOUBLE_EQ(cad::rates::shard_forward_flops({128, 1024}, spec), 16384.0 * 122944);
  // Dense causal 16K: 16384 * 16385 / 2 entries.
  EXPECT_DOUBLE_EQ(cad::rates::shard_forward_flops({16384, 16384}, spec), 16384.0 * (16384.0 * 16385 / 2));
}

TEST(RateGrid, ShardCountMeetsTheTargetWithinTheCaps) {
  const GridSpec spec;
  const double target = spec.target_gflop * 1e9;
  for (const cad::rates::PlannedShape& p : cad::rates::shapes_to_time(spec)) {
    const Shape s = p.shape;
    SCOPED_TRACE("shape " + cad::rates::to_string(s));
    const int64_t n = cad::rates::shards_for(s, spec);
    const double shard = cad::rates::shard_forward_flops(s, spec);
    ASSERT_GE(n, 1);
    const int64_t units = (s.q + 127) / 128 * spec.hq;  // forward units of one shard
    if (n > 1) {
      EXPECT_LE(n * s.q, spec.max_q_rows);
      EXPECT_LE(n * s.kv, spec.max_kv_rows);
      // No more shards than the target or the unit floor needs.
      EXPECT_TRUE((n - 1) * shard < target || (n - 1) * units < spec.min_units);
    }
    const bool capped = (n + 1) * s.q > spec.max_q_rows || (n + 1) * s.kv > spec.max_kv_rows;
    if (!capped) {
      EXPECT_GE(n * shard, target);
      EXPECT_GE(n * units, spec.min_units);
    }
  }
  // By hand: (32, 256) has 32*256 - 32*31/2 = 7696 entries = 126091264 FLOPs per shard;
  // ceil(400e9 / 126091264) = 3173 (3172.3), below both caps (4096 and 4096).
  EXPECT_EQ(cad::rates::shards_for({32, 256}, spec), 3173);
  // (256, 256) would need 5797 shards; the 131072 query rows allow 512.
  EXPECT_EQ(cad::rates::shards_for({256, 256}, spec), 512);
  // (128, 131072): 274.7 GFLOP per shard, 2 wanted (ceil of 1.46); one shard is 1 x 32 forward units, so
  // 1056 units want 33; the key rows allow 8.
  EXPECT_EQ(cad::rates::shards_for({128, 131072}, spec), 8);
  // (2048, 131072): 4.3 TFLOP, 1 by FLOPs; 16 x 32 = 512 units, so 3 (1536 units); allowed 8.
  EXPECT_EQ(cad::rates::shards_for({2048, 131072}, spec), 3);
  // (8192, 65536): 64 x 32 = 2048 units, already 1.9x the floor: one shard.
  EXPECT_EQ(cad::rates::shards_for({8192, 65536}, spec), 1);
  GridSpec no_floor = spec;
  no_floor.min_units = 0;  // FLOPs alone, as before the floor
  EXPECT_EQ(cad::rates::shards_for({128, 131072}, no_floor), 2);
  EXPECT_EQ(cad::rates::shards_for({2048, 131072}, no_floor), 1);
  GridSpec tight = spec;
  tight.max_kv_rows = 100000;  // 97 shards of 1024 keys
  EXPECT_EQ(cad::rates::shards_for({128, 1024}, tight), 97);
  tight.max_q_rows = 64;  // below one shard of 128 queries: still one shard
  EXPECT_EQ(cad::rates::shards_for({128, 1024}, tight), 1);
  GridSpec big = spec;
  big.target_gflop = 1e-3;  // less than one shard's work: one shard
  big.min_units = 0;
  EXPECT_EQ(cad::rates::shards_for({32, 256}, big), 1);
  big.min_units = 64;  // 32 units per shard of 32 queries: two shards
  EXPECT_EQ(cad::rates::shards_for({32, 256}, big), 2);
}

TEST(RateGrid, ShapesToTimeCoverTheGridAndTheDiagonal) {
  GridSpec spec;
  spec.q_lens = {64, 1024, 8192};
  spec.kv_lens = {512, 4096};
  spec.dense_len = 4096;
  const std::vector<cad::rates::PlannedShape> shapes = cad::rates::shapes_to_time(spec);
  std::map<Shape, std::string> roles;
  for (const auto& p : shapes) {
    EXPECT_LE(p.shape.q, p.shape.kv) << cad::rates::to_string(p.shape);
    EXPECT_TRUE(roles.emplace(p.shape, p.role).second) << "timed twice: " << cad::rates::to_string(p.shape);
  }
  // Grid cells with q <= kv, the diagonal shapes that (1024, 512), (8192, 512), (8192, 4096) copy, and the
  // dense 4096 (the same shape as the diagonal (4096, 4096)).
  const std::map<Shape, std::string> want = {{{64, 512}, "grid"},        {{64, 4096}, "grid"},
                                             {{1024, 4096}, "grid"},     {{512, 512}, "diagonal"},
                                             {{4096, 4096}, "diagonal+dense"}};
  EXPECT_EQ(roles, want);
  EXPECT_EQ(cad::rates::timed_shape_of({8192, 512}), (Shape{512, 512}));
  EXPECT_EQ(cad::rates::timed_shape_of({64, 512}), (Shape{64, 512}));
}

// A fake measurement of every shape: rate(q, kv) TFLOP/s forward and 0.7x that backward, exact to 0.1.
double fake_fwd_rate(const Shape& s) { return 100.0 + 0.5 * static_cast<double>(s.q % 997) + static_cast<double>(s.kv % 89); }
double fake_bwd_rate(const Shape& s) { return std::round(fake_fwd_rate(s) * 7.0) / 10.0; }

std::map<Shape, Measurement> fake_measurements(const GridSpec& spec) {
  std::map<Shape, Measurement> out;
  for (const auto& p : cad::rates::shapes_to_time(spec)) {
    const cad::rates::ShardBatch b = cad::rates::make_batch(p.shape, cad::rates::shards_for(p.shape, spec), spec);
    const double fwd_ms = b.forward_flops / (fake_fwd_rate(p.shape) * 1e9);
    const double bwd_ms = cad::rates::kBackwardFlopRatio * b.forward_flops / (fake_bwd_rate(p.shape) * 1e9);
    out[p.shape] = cad::rates::measurement_of(b, fwd_ms, bwd_ms);
  }
  return out;
}

cad::rates::TableInfo fake_info() {
  cad::rates::TableInfo info;
  info.gpu = "Test GPU";
  info.date = "2026-11-25";
  info.source_tag = "abc1234 2026-11-25";
  info.command = "cad_measure_rate_table --out x.json";
  info.kernels = "wgmma (sm_90a) kernels, 132 SMs";
  info.warmups = 2;
  info.reps = 10;
  return info;
}

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

TEST(RateGrid, WrittenTableReadsBackWithTheMeasuredRates) {
  const GridSpec spec;
  const std::map<Shape, Measurement> measured = fake_measurements(spec);
  const std::string text = cad::rates::table_json(spec, measured, fake_info());
  const cad::plan::RateTable t = cad::plan::parse_rate_table(text, "written.json");
  EXPECT_EQ(t.gpu, "Test GPU");
  EXPECT_EQ(t.head_dim, 128);
  EXPECT_DOUBLE_EQ(t.backward_flop_ratio, 2.5);
  EXPECT_EQ(t.q_lens, spec.q_lens);
  EXPECT_EQ(t.kv_lens, spec.kv_lens);
  EXPECT_EQ(t.dense_len, 16384);
  EXPECT_DOUBLE_EQ(t.dense_fwd.tflops, fake_fwd_rate({16384, 16384}));
  EXPECT_DOUBLE_EQ(t.dense_bwd.tflops, fake_bwd_rate({16384, 16384}));
  EXPECT_NE(t.dense_fwd.source.find("1 shard of 16384 queries on 16384 keys"), std::string::npos) << t.dense_fwd.source;

  const size_t nk = spec.kv_lens.size();
  int reachable = 0, unreachable = 0;
  for (size_t qi = 0; qi < spec.q_lens.size(); ++qi) {
    for (size_t ki = 0; ki < nk; ++ki) {
      const Shape cell{spec.q_lens[qi], spec.kv_lens[ki]};
      SCOPED_TRACE("cell " + cad::rates::to_string(cell));
      const Shape timed = cad::rates::timed_shape_of(cell);
      const cad::plan::Rate& f = t.fwd[qi * nk + ki];
      const cad::plan::Rate& b = t.bwd[qi * nk + ki];
      EXPECT_DOUBLE_EQ(f.tflops, fake_fwd_rate(timed));
      EXPECT_DOUBLE_EQ(b.tflops, fake_bwd_rate(timed));
      EXPECT_DOUBLE_EQ(t.fwd_tflops(cell.q, cell.kv), fake_fwd_rate(timed));  // the lookup hits the cell
      const Measurement& m = measured.at(timed);
      const std::string batch = std::to_string(m.n) + (m.n == 1 ? " shard of " : " shards of ") +
                                std::to_string(timed.q) + " queries on " + std::to_string(timed.kv) + " keys each";
      for (const cad::plan::Rate* r : {&f, &b}) {
        EXPECT_NE(r->source.find("cad_measure_rate_table: " + batch), std::string::npos) << r->source;
        EXPECT_NE(r->source.find("2026-11-25, abc1234 2026-11-25"), std::string::npos) << r->source;
      }
      if (cell.q > cell.kv) {
        ++unreachable;
        const std::string want = "unreachable: q > kv, copy of (" + std::to_string(cell.kv) + ", " +
                                 std::to_string(cell.kv) + ")";
        EXPECT_TRUE(starts_with(f.source, want)) << f.source;
        EXPECT_TRUE(starts_with(b.source, want)) << b.source;
      } else {
        ++reachable;
        EXPECT_TRUE(starts_with(f.source, "cad_measure_rate_table: ")) << f.source;
        EXPECT_NE(f.source.find("fwd "), std::string::npos);
        EXPECT_NE(b.source.find("bwd "), std::string::npos);
      }
    }
  }
  EXPECT_EQ(reachable, 26);
  EXPECT_EQ(unreachable, 10);

  // The informative keys the reader ignores.
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc.at("num_q_heads"), 32);
  EXPECT_EQ(doc.at("num_kv_heads"), 8);
  EXPECT_EQ(doc.at("dtype"), "bf16");
  const std::string comment = doc.at("comment");
  EXPECT_NE(comment.find("cad_measure_rate_table --out x.json"), std::string::npos) << comment;
  EXPECT_NE(comment.find("Test GPU (wgmma (sm_90a) kernels, 132 SMs)"), std::string::npos) << comment;
}

TEST(RateGrid, RatesAreRoundedToATenth) {
  GridSpec spec;
  spec.q_lens = {128};
  spec.kv_lens = {1024};
  spec.dense_len = 1024;
  std::map<Shape, Measurement> measured;
  for (const Shape& s : {Shape{128, 1024}, Shape{1024, 1024}}) {
    const cad::rates::ShardBatch b = cad::rates::make_batch(s, 3, spec);
    measured[s] = cad::rates::measurement_of(b, b.forward_flops / (612.34 * 1e9),
                                             2.5 * b.forward_flops / (401.26 * 1e9));
  }
  const cad::plan::RateTable t = cad::plan::parse_rate_table(cad::rates::table_json(spec, measured, fake_info()), "t");
  EXPECT_DOUBLE_EQ(t.fwd[0].tflops, 612.3);
  EXPECT_DOUBLE_EQ(t.bwd[0].tflops, 401.3);
}

TEST(RateGrid, RefusesAnIncompleteTableNamingTheMissingShapes) {
  const GridSpec spec;
  std::map<Shape, Measurement> measured = fake_measurements(spec);
  measured.erase({512, 4096});
  measured.erase({256, 256});  // the diagonal shape that (512, 256) etc. copy
  const std::vector<Shape> missing = cad::rates::missing_shapes(spec, measured);
  EXPECT_EQ(missing, (std::vector<Shape>{{512, 4096}, {256, 256}}));
  try {
    cad::rates::table_json(spec, measured, fake_info());
    FAIL() << "an incomplete table was written";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("2 shape(s) (q, kv) not measured: (512, 4096), (256, 256)"), std::string::npos) << msg;
  }
  EXPECT_TRUE(cad::rates::missing_shapes(spec, fake_measurements(spec)).empty());
}

TEST(RateGrid, RefusesTimesThatGiveNoRate) {
  const GridSpec spec;
  std::map<Shape, Measurement> measured = fake_measurements(spec);
  measured[{128, 1024}].bwd_ms = 0;
  try {
    cad::rates::table_json(spec, measured, fake_info());
    FAIL() << "a zero time was written";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("shape (128, 1024)"), std::string::npos) << e.what();
  }
}

TEST(RateGrid, ParsesLengthLists) {
  EXPECT_EQ(cad::rates::parse_lengths("32,128,4k", "--q-lens"), (std::vector<int64_t>{32, 128, 4096}));
  EXPECT_EQ(cad::rates::parse_lengths("131072", "--kv-lens"), (std::vector<int64_t>{131072}));
  auto message = [](const std::string& text) {
    try {
      cad::rates::parse_lengths(text, "--kv-lens");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(message("32,16"), "--kv-lens[1] = 16: lengths must be strictly increasing");
  EXPECT_EQ(message("0,16"), "--kv-lens[0] = 0: lengths must be >= 1");
  EXPECT_NE(message("32,,64").find("--kv-lens: '' in '32,,64' is not a length"), std::string::npos);
  EXPECT_NE(message("1m").find("'1m'"), std::string::npos);
  EXPECT_NE(message("").find("is not a length"), std::string::npos);
  EXPECT_NE(message("-5").find("is not a length"), std::string::npos);
}

TEST(RateGrid, ValidatesTheSpec) {
  GridSpec spec;
  spec.hq = 12;
  spec.hkv = 8;
  EXPECT_THROW(cad::rates::validate(spec), std::invalid_argument);
  spec = GridSpec{};
  spec.target_gflop = 0;
  EXPECT_THROW(cad::rates::validate(spec), std::invalid_argument);
  spec = GridSpec{};
  spec.min_units = -1;
  EXPECT_THROW(cad::rates::validate(spec), std::invalid_argument);
  spec = GridSpec{};
  spec.kv_lens = {};
  EXPECT_THROW(cad::rates::validate(spec), std::invalid_argument);
  EXPECT_NO_THROW(cad::rates::validate(GridSpec{}));
  EXPECT_THROW(cad::rates::make_batch({512, 256}, 1, GridSpec{}), std::invalid_argument);  // q > kv
}

}  // namespace
