// long_docs.h -- one step's documents laid over the ranks whole, when documents may be longer than one
// rank: the layout rule of the Python package's cad.pack_documents (host_adapter/python/cad/packing.py),
// for `cad plan` and the C++ tests. The step's token stream is the documents in order; rank r holds tokens
// [r * tokens_per_rank, (r + 1) * tokens_per_rank) of it, so a document is cut wherever a rank's buffer ends
// into pieces on consecutive ranks, each with the document's own id (its index in the list), doc_len and
// offset: positions run on across a cut. What does not fit is dropped from the end; the last document that
// fits partly is shortened to what fits (its doc_len is the tokens kept). The pieces themselves come from
// batch_recipe.h's pack(): one packing rule, with this file's checks in front.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "batch_recipe.h"

namespace cad::workload {

// Thrown with a message naming the document or the numbers that do not fit.
class LayoutError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The largest step laid out: 2^50 tokens (8192 ranks of 2^37), far above any step, below int64 trouble.
constexpr int64_t kMaxStepTokens = int64_t{1} << 50;

// Lays `docs` (lengths in tokens, in order) over `ranks` buffers of tokens_per_rank tokens. Throws
// LayoutError when a length is not positive or a document is longer than max_doc_len (0 = no limit; naming
// the document; checked up to the first document that finds the step full, as cad.pack_documents does),
// ranks x tokens_per_rank exceeds kMaxStepTokens, or the documents hold fewer tokens than the ranks (every
// rank is filled, as cad.pack_documents requires).
RankPieces pack_whole(const std::vector<int64_t>& docs, int64_t tokens_per_rank, int32_t ranks, int64_t max_doc_len = 0);

// A sampled step: DistCA's recipe (batch_recipe.h) with the lengths scaled to max_doc_len (the recipe's
// 64K documents become max_doc_len long) instead of to the tokens per rank, laid out by pack_whole.
// `stream` receives the documents in the order laid (the last one before it was shortened), so that any
// implementation of the rule can lay them again and compare.
RankPieces sample_long_batch(const std::vector<int64_t>& lengths, int64_t max_doc_len, int64_t tokens_per_rank,
                             int32_t ranks, uint64_t seed, std::vector<int64_t>* stream = nullptr);

// What a layout is: documents, pieces, and the longest document's reach (how many ranks it spans).
struct LayoutSummary {
  int64_t tokens = 0;
  int64_t documents = 0;
  int64_t pieces = 0;
  int64_t longest = 0;        // tokens of the longest document
  int64_t longest_doc = -1;   // its id
  int32_t widest_span = 0;    // most ranks one document lies on
};
LayoutSummary summarize(const RankPieces& ranks);

}  // namespace cad::workload
