// batch_recipe.h -- turning document lengths into one step's piece tables, with the DistCA evaluation
// recipe (see /work/shared/data/README.md):
//   1. documents are cut at 64K tokens; every full 64K-token chunk is upsampled (appears twice), and 90%
//      of the shorter documents and remainders are kept (each independently, with probability 0.9);
//   2. the list is shuffled with a fixed seed and every length scaled by context / 65536;
//   3. documents are packed in order into per-rank buffers of `context` tokens; a document that
//      overflows a buffer is cut and its remainder starts the next buffer.
// The random numbers come from our own generator (splitmix64), so a seed gives the same batch with
// every compiler and standard library.
#pragma once

#include <cstdint>
#include <vector>

#include "cad_common_v1.h"

namespace cad::workload {

using RankPieces = std::vector<std::vector<cad_piece_v1_t>>;

constexpr int64_t kRecipeSplitTokens = 65536;
constexpr int64_t kMaxRecipeDocuments = int64_t{1} << 24;  // 128 MiB of lengths

// Steps 1 and 2: the recipe's document stream (scaled lengths, shuffled). Lengths scale with rounding
// to the nearest token, at least 1.
std::vector<int64_t> recipe_documents(const std::vector<int64_t>& lengths, int64_t context, uint64_t seed);

// Step 3: packs `docs` in order into `ranks` buffers of `context` tokens each. Document ids are the
// positions in `docs`. Packing stops when the buffers are full; a document cut by the end of the last
// buffer is truncated to what fits (so every document's pieces tile [0, doc_len)). Buffers may stay
// partly empty when the documents run out.
RankPieces pack(const std::vector<int64_t>& docs, int64_t context, int32_t ranks);

// One sampled batch: recipe_documents + pack. The stream is repeated (with seeds seed+1, ...) if
// one pass does not fill ranks * context tokens. Throws std::invalid_argument, before allocating, when
// the recipe would list more than kMaxRecipeDocuments documents (a 1e15-token length is cut into
// 3e10 chunks of 64K), or context is outside [1, 2^40].
RankPieces sample_batch(const std::vector<int64_t>& lengths, int64_t context, int32_t ranks, uint64_t seed);

// The same recipe with the longest document apart from the tokens per rank (long_docs.h): lengths scale by
// max_doc_len / 65536 in step 2 and pack into `ranks` buffers of tokens_per_rank in step 3, so a document
// longer than a rank lies on consecutive ranks as pieces of one document. `stream`, when given, receives
// the documents handed to pack() (the last one before truncation). sample_batch(l, c, r, s) is
// sample_batch_scaled(l, c, c, r, s).
RankPieces sample_batch_scaled(const std::vector<int64_t>& lengths, int64_t max_doc_len, int64_t tokens_per_rank,
                               int32_t ranks, uint64_t seed, std::vector<int64_t>* stream = nullptr);

// Per-rank causal score entries (sum over pieces of q*kv - q*(q-1)/2), for checking the recipe.
std::vector<int64_t> causal_cost_per_rank(const RankPieces& ranks);

}  // namespace cad::workload
