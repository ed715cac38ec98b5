// The long-document layout (workload/long_docs.h): every token once, positions continuous across cuts,
// documents laid in order, every rank full, the refusals; and the recipe scaled to the longest document.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "long_docs.h"

namespace {

using cad::workload::LayoutError;
using cad::workload::pack_whole;
using cad::workload::RankPieces;

// Checks the layout's rules and returns each document's tokens laid out (doc id -> its doc_len).
std::map<int64_t, int64_t> check_layout(const RankPieces& ranks, int64_t tokens_per_rank) {
  std::map<int64_t, int64_t> next;     // doc -> the offset its next piece must start at
  std::map<int64_t, int64_t> doc_len;  // doc -> doc_len (the same on every piece)
  int64_t previous_doc = -1;
  for (size_t r = 0; r < ranks.size(); ++r) {
    int64_t tokens = 0;
    for (const auto& p : ranks[r]) {
      EXPECT_GT(p.len, 0) << "rank " << r;
      EXPECT_GE(p.doc_id, previous_doc) << "documents out of order on rank " << r;
      if (p.doc_id != previous_doc) {
        EXPECT_EQ(p.offset_in_doc, 0) << "document " << p.doc_id << " does not start at its first token";
        EXPECT_EQ(next.count(p.doc_id), 0u) << "document " << p.doc_id << " laid twice";
        doc_len[p.doc_id] = p.doc_len;
      } else {
        // Continuous across the cut: the piece starts where the previous rank's piece ended.
        EXPECT_EQ(p.offset_in_doc, next[p.doc_id]) << "document " << p.doc_id << " on rank " << r;
        EXPECT_EQ(p.doc_len, doc_len[p.doc_id]);
      }
      next[p.doc_id] = p.offset_in_doc + p.len;
      previous_doc = p.doc_id;
      tokens += p.len;
    }
    EXPECT_EQ(tokens, tokens_per_rank) << "rank " << r << " is not full";
  }
  for (const auto& [doc, end] : next) EXPECT_EQ(end, doc_len[doc]) << "document " << doc << " not covered to its end";
  return doc_len;
}

TEST(LongDocs, OneMillionTokenDocumentOverEightRanks) {
  const RankPieces ranks = pack_whole({1 << 20}, 1 << 17, 8);
  ASSERT_EQ(ranks.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    ASSERT_EQ(ranks[r].size(), 1u);
    EXPECT_EQ(ranks[r][0].doc_id, 0);
    EXPECT_EQ(ranks[r][0].doc_len, 1 << 20);
    EXPECT_EQ(ranks[r][0].offset_in_doc, int64_t{r} << 17);
    EXPECT_EQ(ranks[r][0].len, 1 << 17);
  }
}

TEST(LongDocs, MixedLengthsCoverEveryTokenOnceAndShortenTheLast) {
  // 10 + 30 + 7 + 50 + 100 = 197 tokens for 4 ranks of 16 = 64: document 3 is cut to 17 tokens, 4 dropped.
  const RankPieces ranks = pack_whole({10, 30, 7, 50, 100}, 16, 4);
  const auto lens = check_layout(ranks, 16);
  EXPECT_EQ(lens, (std::map<int64_t, int64_t>{{0, 10}, {1, 30}, {2, 7}, {3, 17}}));
  // Document 1 lies on ranks 0, 1 and 2: [0, 6) [6, 22) [22, 30).
  EXPECT_EQ(ranks[1].size(), 1u);
  EXPECT_EQ(ranks[1][0].doc_id, 1);
  EXPECT_EQ(ranks[1][0].offset_in_doc, 6);
  EXPECT_EQ(ranks[2][0].offset_in_doc, 22);
  EXPECT_EQ(ranks[2][0].len, 8);
}

TEST(LongDocs, ExactCapacityKeepsEveryDocumentWhole) {
  const auto lens = check_layout(pack_whole({5, 3, 24}, 8, 4), 8);
  EXPECT_EQ(lens, (std::map<int64_t, int64_t>{{0, 5}, {1, 3}, {2, 24}}));
}

TEST(LongDocs, Refusals) {
  EXPECT_THROW(pack_whole({10, 10}, 16, 2), LayoutError);  // 20 tokens cannot fill 32
  try {
    pack_whole({8, 40}, 24, 2, 32);
    FAIL() << "a document above max_doc_len was laid out";
  } catch (const LayoutError& e) {
    EXPECT_STREQ(e.what(), "document 1 has 40 tokens, above max_doc_len 32");
  }
  EXPECT_THROW(pack_whole({0, 40}, 8, 2), LayoutError);
  EXPECT_THROW(pack_whole({1 << 20}, 0, 2), LayoutError);
  EXPECT_THROW(pack_whole({1 << 20}, int64_t{1} << 40, 8192), LayoutError);  // more than 2^50 tokens
  // Documents are checked up to the first that finds the step full (cad.pack_documents' order); later ones
  // are dropped unchecked.
  EXPECT_THROW(pack_whole({16, 1000}, 8, 2, 16), LayoutError);
  EXPECT_NO_THROW(pack_whole({16, 8, 1000}, 8, 2, 16));
  EXPECT_THROW(pack_whole({16, 0}, 8, 2), LayoutError);  // the first document past the step is checked too
  EXPECT_THROW(pack_whole({15, 0}, 8, 2), LayoutError);
}

TEST(LongDocs, RecipeScalesToTheLongestDocument) {
  // The recipe's 64K documents become max_doc_len long; the tokens per rank are a separate setting.
  const std::vector<int64_t> lengths = {65536, 200000, 3000, 120, 40000, 9000};
  const int64_t max_doc_len = 1 << 16, tokens_per_rank = 1 << 12;
  for (uint64_t seed : {1u, 2u, 7u}) {
    std::vector<int64_t> stream;
    const RankPieces ranks = cad::workload::sample_long_batch(lengths, max_doc_len, tokens_per_rank, 8, seed, &stream);
    const auto lens = check_layout(ranks, tokens_per_rank);
    ASSERT_FALSE(stream.empty());
    EXPECT_EQ(stream.size(), lens.size());
    for (int64_t d : stream) EXPECT_LE(d, max_doc_len);
    // The stream is the recipe at max_doc_len: its documents are those of recipe_documents, in order.
    const std::vector<int64_t> recipe = cad::workload::recipe_documents(lengths, max_doc_len, seed);
    ASSERT_LE(stream.size(), recipe.size());
    EXPECT_TRUE(std::equal(stream.begin(), stream.end(), recipe.begin()));
    // And laying the stream out again gives the same pieces.
    EXPECT_EQ(cad::workload::pack_whole(stream, tokens_per_rank, 8).size(), ranks.size());
    const RankPieces again = cad::workload::pack_whole(stream, tokens_per_rank, 8);
    for (size_t r = 0; r < ranks.size(); ++r) {
      ASSERT_EQ(again[r].size(), ranks[r].size());
      for (size_t i = 0; i < ranks[r].size(); ++i) {
        EXPECT_EQ(again[r][i].doc_id, ranks[r][i].doc_id);
        EXPECT_EQ(again[r][i].doc_len, ranks[r][i].doc_len);
        EXPECT_EQ(again[r][i].offset_in_doc, ranks[r][i].offset_in_doc);
        EXPECT_EQ(again[r][i].len, ranks[r][i].len);
      }
    }
  }
  // With max_doc_len = tokens per rank it is DistCA's recipe as sample_batch gives it.
  const RankPieces a = cad::workload::sample_batch(lengths, 4096, 4, 3);
  const RankPieces b = cad::workload::sample_batch_scaled(lengths, 4096, 4096, 4, 3);
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size());
    for (size_t i = 0; i < a[r].size(); ++i) EXPECT_EQ(a[r][i].doc_len, b[r][i].doc_len);
  }
}

TEST(LongDocs, SummaryCountsTheWidestSpan) {
  const auto s = cad::workload::summarize(pack_whole({10, 30, 7, 50}, 16, 4));
  EXPECT_EQ(s.tokens, 64);
  EXPECT_EQ(s.documents, 4);
  EXPECT_EQ(s.pieces, 7);  // 0 | 1 on 0,1,2 | 2 on 2 | 3 on 2,3
  EXPECT_EQ(s.longest, 30);
  EXPECT_EQ(s.longest_doc, 1);
  EXPECT_EQ(s.widest_span, 3);
}

}  // namespace
