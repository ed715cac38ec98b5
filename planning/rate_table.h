// rate_table.h -- measured attention-kernel rates of one GPU kind, shared by the balancers (to predict
// a shard's time) and the simulator (to predict a server's time). Plain data + a reader: no plugin
// state, no logging. Errors are std::invalid_argument whose message names the file and the key.
//
// Why: the kernels' rate depends on the shard's shape (a 128-query shard on a long KV prefix runs its
// backward well below the dense rate; a ragged buffer of short documents runs below it too), so equal
// FLOPs are not equal time. A shard of q queries whose last query sees kv keys (causal: kv = q_end;
// non-causal: kv = doc_len) is looked up at (q, kv).
//
// JSON schema (one file per GPU kind, e.g. configs/calibration/h200.json; unknown keys are ignored,
// every key below is required unless marked optional):
//   {
//     "gpu": "NVIDIA H200",                       // free text
//     "head_dim": 128,                            // the rates hold for this head dim only
//     "num_q_heads": 32, "num_kv_heads": 8,       // optional, informative (the measured shape)
//     "dtype": "bf16",                            // optional, informative
//     "backward_flop_ratio": 2.5,                 // backward FLOPs = ratio x forward FLOPs
//     "dense": {                                  // dense causal attention, one document of `len`
//       "len": 16384,                             //   tokens (q = kv = len): the reference rate
//       "fwd": {"tflops": 701, "source": "..."},
//       "bwd": {"tflops": 480, "source": "..."}
//     },
//     "q_lens":  [128, 1024, ...],                // grid axes: strictly increasing, >= 1
//     "kv_lens": [1024, 4096, ...],
//     "grid": [                                   // exactly one entry per (q_len, kv_len) pair
//       {"q": 128, "kv": 1024,
//        "fwd": {"tflops": 562, "source": "..."},
//        "bwd": {"tflops": 379, "source": "..."}},
//       ...
//     ],
//     "backward_tiles": {                         // optional: the backward priced by tile pairs
//       "block_m": 64, "block_n": 128,            //   query step and key tile of the kernel (block_n
//                                                 //   a multiple of block_m)
//       "full_pair_us": 0.0215,                   //   microseconds per full / partial pair, ONE query
//       "partial_pair_us": 0.0648,                //   head (tile_pairs.h says exactly what a pair is)
//       "source": "..."                           //   the fit's command and data
//     }
//   }
// Every rate is {"tflops": > 0, "source": non-empty string}: the command or document it comes from,
// or "assumed: <why>" / "unreachable: <why>" for entries nobody measured. Cells with q > kv cannot
// occur for a causal shard (kv >= q) but bilinear interpolation near the diagonal reads them, so the
// grid must still be complete (fill them with the q = kv rate and say so in the source).
//
// Lookup: bilinear interpolation of the rate in (log q, log kv); q and kv outside the grid are clamped
// to its edges (the nearest measured shape, not an extrapolation).
//
// With "backward_tiles" a shard's BACKWARD time is full_pair_us x full pairs + partial_pair_us x partial
// pairs (per query head, times the query heads), not its FLOPs over the grid's bwd rate: the backward's
// per-server time follows the causal diagonal's cut pairs, which a rate by (q, kv) cannot see (docs/
// simulate.md). The forward keeps the grid. The grid's bwd rates stay required (the dense
// reference and a reader without the key use them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cad::plan {

struct Rate {
  double tflops = 0;
  std::string source;
};

// The optional "backward_tiles" key (see the schema above).
struct BackwardTiles {
  int64_t block_m = 0, block_n = 0;
  double full_pair_us = 0, partial_pair_us = 0;
  std::string source;
};

struct RateTable {
  std::string path;  // where it was read from (for messages); "" if parsed from text
  std::string gpu;
  int32_t head_dim = 0;
  double backward_flop_ratio = 2.5;
  int64_t dense_len = 0;
  Rate dense_fwd, dense_bwd;
  std::vector<int64_t> q_lens, kv_lens;
  std::vector<Rate> fwd, bwd;  // [qi * kv_lens.size() + ki]
  std::vector<double> log_q_lens, log_kv_lens;  // filled by the reader (lookups are hot in balancers)
  double dense_time = 0;  // filled by the reader: 1 / dense_fwd + backward_flop_ratio / dense_bwd
  bool has_backward_tiles = false;
  BackwardTiles backward_tiles;  // valid when has_backward_tiles
  double dense_entries_per_us = 0;  // filled by the reader: dense-rate score entries (one head) per microsecond

  // Interpolated rate, TFLOP/s, of a shard with q queries whose KV length is kv.
  double fwd_tflops(int64_t q, int64_t kv) const;
  double bwd_tflops(int64_t q, int64_t kv) const;
  // Predicted backward seconds of a shard of that shape whose forward costs fwd_flops, run for
  // `q_heads` query heads: the tile-pair formula with backward_tiles, else fwd_flops x
  // backward_flop_ratio / the bwd rate. THE backward rule (the balancers' cost, `cad plan` and the
  // simulator all come here).
  double bwd_seconds(int64_t q, int64_t kv, bool causal, double fwd_flops, int64_t q_heads) const;
  // Predicted forward + backward seconds of that shard (forward: fwd_flops / the fwd rate).
  double shard_seconds(int64_t q, int64_t kv, bool causal, double fwd_flops, int64_t q_heads) const;
  // The shortest shard (queries) this table prices from its own measurements: its smallest query length,
  // and with backward_tiles at least one backward query tile (block_m). Shorter shards are priced by
  // clamping to the grid's edge and pay a whole tile of pairs per key tile, so a balancer that cuts them
  // trades real balance for the cut's added time (prefix_aware in time mode cuts no shorter).
  int64_t shortest_priced_shard() const;
  // Forward + backward time per FLOP of that shape over the same for the dense entry: 1 = as fast as
  // dense causal attention, 1.2 = 20% slower. What a balancer weighs score entries with.
  double relative_time(int64_t q, int64_t kv) const;

  // The same in two steps, for a caller that looks up many q at one kv (a binary search over shard
  // starts): where q and kv fall on their axes (the log and the search), then the interpolation.
  // relative_time_at(locate_q(q), locate_kv(kv)) is relative_time(q, kv), bit for bit.
  struct AxisPoint {
    size_t index = 0;    // the cell's lower grid line
    double weight = 0;   // weight of the line above it (0 = on or below the lower edge)
  };
  AxisPoint locate_q(int64_t q) const;
  AxisPoint locate_kv(int64_t kv) const;
  double relative_time_at(AxisPoint q, AxisPoint kv) const;

  // What a balancer weighs a shard of `entries` score entries with, in dense-rate score entries (the
  // unit of relative_time: entries x relative_time(q, kv) without backward_tiles, exactly that
  // expression). With backward_tiles: entries x the forward's share of relative_time plus the tile
  // pairs' microseconds in dense entries of one head (the head count cancels: both sides are per head).
  // q_at / kv_at must be locate_q(q) / locate_kv(kv).
  double weighted_entries_at(int64_t entries, int64_t q, int64_t kv, bool causal, AxisPoint q_at,
                             AxisPoint kv_at) const;
};

// Reads and validates a rate table; throws std::invalid_argument naming `path` and the bad key.
RateTable load_rate_table(const std::string& path);
// The same from JSON text; `name` stands for the file in messages.
RateTable parse_rate_table(const std::string& json_text, const std::string& name);

}  // namespace cad::plan
