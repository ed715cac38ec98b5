// demo_batch.h -- the batch of `cad demo`'s CAD mode: per-rank piece tables sampled from the Pretrain
// document-length distribution with the DistCA recipe (cad_workload), or random documents when no
// distribution file is at hand; and every rank's Q/K/V/dO filled from the seed and each token's place in
// its document, so that the values do not depend on how the batch is laid out over ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "batch_recipe.h"
#include "demo_common.h"

namespace cad::demo {

struct BatchOptions {
  std::string dist;         // document-length file; empty: look in the default places
  int64_t context = 4096;   // tokens per rank
  uint64_t seed = 1;
};

struct Batch {
  std::string source;                 // one line saying where the documents came from
  std::vector<std::string> notes;     // what rank 0 should tell the user (e.g. a fallback)
  cad::workload::RankPieces pieces;   // per rank
  int64_t documents = 0;
};

// The same batch on every rank (no communication). Throws cad::workload::LengthsError if `dist` was
// given and cannot be read; falls back to random documents only when it was not given.
Batch make_batch(const BatchOptions& options, int32_t world);

struct Inputs {
  Tensor q, k, v, d_o;  // [T, Hq, D], [T, Hkv, D], [T, Hkv, D], [T, Hq, D]
};

// This rank's tensors for its `pieces` (in their order). Every element is a uniform(-1, 1) value
// hashed from (seed, tensor, document, position in the document, element).
Inputs fill_inputs(const std::vector<cad_piece_v1_t>& pieces, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   uint64_t seed);

}  // namespace cad::demo
