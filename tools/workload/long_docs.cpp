// long_docs.cpp -- see long_docs.h.
#include "long_docs.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

namespace cad::workload {

RankPieces pack_whole(const std::vector<int64_t>& docs, int64_t tokens_per_rank, int32_t ranks, int64_t max_doc_len) {
  if (tokens_per_rank < 1 || ranks < 1) {
    throw LayoutError("tokens_per_rank and ranks must be positive, got " + std::to_string(tokens_per_rank) + " and " +
                      std::to_string(ranks));
  }
  if (max_doc_len < 0) throw LayoutError("max_doc_len must be positive (0 = no limit), got " + std::to_string(max_doc_len));
  if (tokens_per_rank > kMaxStepTokens / ranks) {
    throw LayoutError(std::to_string(ranks) + " ranks x " + std::to_string(tokens_per_rank) +
                      " tokens is more than 2^50 tokens in one step");
  }
  const int64_t capacity = tokens_per_rank * ranks;
  int64_t total = 0;
  // Each document is checked up to and including the first that finds the step full (as cad.pack_documents).
  for (size_t i = 0; i < docs.size(); ++i) {
    if (docs[i] < 1) {
      throw LayoutError("document " + std::to_string(i) + " has length " + std::to_string(docs[i]) +
                        "; lengths must be positive");
    }
    if (max_doc_len > 0 && docs[i] > max_doc_len) {
      throw LayoutError("document " + std::to_string(i) + " has " + std::to_string(docs[i]) +
                        " tokens, above max_doc_len " + std::to_string(max_doc_len));
    }
    if (total == capacity) break;
    total += std::min(docs[i], capacity - total);
  }
  if (total < capacity) {
    throw LayoutError(std::to_string(total) + " tokens of documents cannot fill " + std::to_string(ranks) +
                      " ranks of " + std::to_string(tokens_per_rank) + " tokens (" + std::to_string(capacity) +
                      "); give more documents");
  }
  return pack(docs, tokens_per_rank, ranks);
}

RankPieces sample_long_batch(const std::vector<int64_t>& lengths, int64_t max_doc_len, int64_t tokens_per_rank,
                             int32_t ranks, uint64_t seed, std::vector<int64_t>* stream) {
  std::vector<int64_t> laid;
  sample_batch_scaled(lengths, max_doc_len, tokens_per_rank, ranks, seed, &laid);
  // The recipe fills the ranks (it repeats its stream until it does); pack_whole checks that it did and
  // lays the same pieces.
  RankPieces out = pack_whole(laid, tokens_per_rank, ranks, max_doc_len);
  if (stream != nullptr) *stream = std::move(laid);
  return out;
}

LayoutSummary summarize(const RankPieces& ranks) {
  LayoutSummary s;
  std::map<int64_t, int32_t> spans;  // doc -> ranks it lies on (a rank holds one piece of a document)
  for (const auto& r : ranks) {
    for (const auto& p : r) {
      s.tokens += p.len;
      ++s.pieces;
      if (p.offset_in_doc == 0) ++s.documents;
      if (p.doc_len > s.longest) {
        s.longest = p.doc_len;
        s.longest_doc = p.doc_id;
      }
      s.widest_span = std::max(s.widest_span, ++spans[p.doc_id]);
    }
  }
  return s;
}

}  // namespace cad::workload
