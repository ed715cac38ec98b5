// rate_grid.h -- the CPU half of cad_measure_rate_table (measure_rate_table.cu): which shapes it times,
// the batch each shape is timed on, and the kernel-rate table it writes from the measured times, in the
// schema of planning/rate_table.h. No CUDA here, so that tests/rate_grid checks all of it on a
// machine without a GPU; the .cu only times the batches (bench/kernels/case_timer.h).
//
// A shape (q, kv) is a causal shard of q queries whose last query sees kv keys: the LAST q queries of a
// document of kv tokens, as CAD's layout gives a tail shard (segment q_len = q, kv_len = kv, bottom-right
// causal). It is timed as one batch of n identical such shards, each with its own document's keys, n
// chosen so that the batch carries about `target_gflop` of forward work (enough to fill the GPU and to
// time well) within the row caps (memory).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cad_common_v1.h"  // cad_segment_v1_t

namespace cad::rates {

// Backward FLOPs per forward FLOP. The same convention as the table's reader (rate_table.h's
// "backward_flop_ratio", default 2.5) and the kernel benchmark (case_timer.h: "The backward counts
// 2.5x"); the forward count is plan_model's (4 * head_dim * Hq * (q*kv - q*(q-1)/2)), which
// case_timer's forward_flops also computes -- measure_rate_table.cu checks that the two agree.
constexpr double kBackwardFlopRatio = 2.5;

struct GridSpec {
  std::vector<int64_t> q_lens{32, 128, 512, 2048, 8192, 32768};
  std::vector<int64_t> kv_lens{256, 1024, 4096, 16384, 65536, 131072};
  int32_t hq = 32, hkv = 8, head_dim = 128;
  // Forward work of one timed batch. 400 GFLOP is ~0.6 ms forward at 700 TFLOP/s: long enough that a
  // call's fixed costs (plan upload, launches, a few us) stay small against it.
  double target_gflop = 400;
  // Caps on n (memory): n*q query rows and n*kv key rows. At Hq 32, Hkv 8, D 128 a query row takes
  // ~49 KiB (Q O dO dQ bf16, dQ fp32 accumulator, LSE) and a key row 8 KiB (K V dK dV): the defaults
  // stay under ~15 GiB. A single shard (n = 1) is timed even if it exceeds a cap.
  int64_t max_q_rows = 131072;
  int64_t max_kv_rows = 1048576;
  // Forward work units (128-query tiles x query heads) one timed batch should hold, so that the GPU is
  // full until near the end, as it is when the shape shares a server batch with others. 1056 = 8 waves of
  // 132 SMs. Without it a long shape was timed as one shard: (2048, 131072) is 16 x 32 = 512 units, 3.9
  // waves, and its cell (585 TFLOP/s forward) sat below both neighbours (651, 600). 0 turns it off.
  int64_t min_units = 1056;
  int64_t dense_len = 16384;  // the table's dense entry: causal documents of this length (q = kv)
};

// Throws std::invalid_argument naming the field that is wrong (axes strictly increasing and >= 1,
// Hq % Hkv == 0, positive target and caps).
void validate(const GridSpec& spec);

struct Shape {
  int64_t q = 0, kv = 0;
  bool operator<(const Shape& o) const { return q != o.q ? q < o.q : kv < o.kv; }
  bool operator==(const Shape& o) const { return q == o.q && kv == o.kv; }
};
std::string to_string(const Shape& s);  // "(q, kv)"

// Forward FLOPs of one shard of that shape (plan_model's task_cost and entries_to_flops).
double shard_forward_flops(const Shape& s, const GridSpec& spec);

// n = max(1, ceil(target / shard FLOPs), ceil(min_units / (ceil(q / 128) * hq))), lowered so that
// n*q <= max_q_rows and n*kv <= max_kv_rows, but never below 1.
int64_t shards_for(const Shape& s, const GridSpec& spec);

// n shards of the shape: shard i has queries [i*q, (i+1)*q) and its own keys [i*kv, (i+1)*kv).
struct ShardBatch {
  Shape shape;
  int64_t n = 0;
  int64_t tq = 0, tk = 0;  // rows of Q and of K/V
  std::vector<cad_segment_v1_t> segments;
  double forward_flops = 0;  // n * shard_forward_flops
};
ShardBatch make_batch(const Shape& s, int64_t n, const GridSpec& spec);

// The grid cell a rate comes from: (q, kv) itself when q <= kv; (kv, kv) when q > kv, which a causal
// shard cannot have (its queries are clamped to its keys) -- the table still needs those cells because
// interpolation near the diagonal reads them.
Shape timed_shape_of(const Shape& cell);

// What to time, each shape once: every grid cell with q <= kv (row-major), then the (kv, kv) shapes that
// the q > kv cells copy and that are not grid cells, then the dense (dense_len, dense_len) shape unless
// already listed. `role` says why it is timed ("grid", "diagonal", "dense", joined by '+').
struct PlannedShape {
  Shape shape;
  std::string role;
};
std::vector<PlannedShape> shapes_to_time(const GridSpec& spec);

// What one timed batch gave.
struct Measurement {
  int64_t n = 0, tq = 0, tk = 0;
  double forward_flops = 0;
  double fwd_ms = 0, bwd_ms = 0;
  double fwd_tflops() const { return forward_flops / (fwd_ms * 1e9); }
  double bwd_tflops() const { return kBackwardFlopRatio * forward_flops / (bwd_ms * 1e9); }
};
Measurement measurement_of(const ShardBatch& b, double fwd_ms, double bwd_ms);

// The shapes of shapes_to_time that `measured` lacks, in that order.
std::vector<Shape> missing_shapes(const GridSpec& spec, const std::map<Shape, Measurement>& measured);

// What the table says about how it was made.
struct TableInfo {
  std::string gpu;         // cudaDeviceProp::name
  std::string date;        // of the run, YYYY-MM-DD (UTC)
  std::string source_tag;  // e.g. "<commit> <date>", from --source-tag; may be empty
  std::string command;     // the command line
  std::string kernels;     // which kernels ran, e.g. "wgmma (sm_90a)", and the SM count
  int warmups = 0, reps = 0;
};

// The complete table as JSON text (rates rounded to 0.1 TFLOP/s). Every rate's source names the tool,
// the timed batch, the date and the tag; q > kv cells say "unreachable: q > kv, copy of (kv, kv)".
// Throws std::runtime_error naming every missing shape, or a shape whose times are not > 0.
std::string table_json(const GridSpec& spec, const std::map<Shape, Measurement>& measured, const TableInfo& info);

// A comma-separated list of lengths ("32,128,1k": integers, k = x1024), strictly increasing, >= 1.
// Throws std::invalid_argument naming `flag` and the bad entry.
std::vector<int64_t> parse_lengths(const std::string& text, const std::string& flag);

}  // namespace cad::rates
