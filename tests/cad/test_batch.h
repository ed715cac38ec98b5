// test_batch.h -- random global batches for the CAD tests. Every rank builds the SAME batch from the
// same seed: documents of random lengths (some of length 1, some longer than a rank's share), cut into
// pieces placed on random ranks in random order (documents split across ranks, empty ranks), and
// random Q/K/V/dO for every token. A rank takes its own pieces' rows; the oracle sees them all.
#pragma once

#include <cstdint>
#include <vector>

#include "cad_common_v1.h"

namespace cad_test {

struct Document {
  int64_t id = 0;
  int64_t len = 0;
  int64_t first_row = 0;  // where the document starts in the global (oracle) token order
};

struct GlobalBatch {
  int32_t world = 1;
  int64_t hq = 4, hkv = 2, d = 16;
  std::vector<Document> docs;                            // the oracle's order: documents one after another
  std::vector<std::vector<cad_piece_v1_t>> pieces;       // per rank, in that rank's token order
  int64_t total_tokens = 0;
  std::vector<float> q, k, v, d_o;                       // global, in the oracle's token order

  // The global row of a rank's local row.
  std::vector<int64_t> global_rows(int32_t rank) const;
  const Document& doc(int64_t id) const;
};

struct BatchSpec {
  uint64_t seed = 1;
  int32_t world = 1;
  int64_t tokens_per_rank = 160;
  int64_t hq = 4, hkv = 2, d = 16;
  bool allow_empty_rank = true;
};

GlobalBatch make_batch(const BatchSpec& spec);

// Rows `rows` of a global [T, width] tensor, in that order.
std::vector<float> take_rows(const std::vector<float>& global, int64_t width, const std::vector<int64_t>& rows);
// Columns `cols` of a global [heads, T] tensor (LSE), giving [heads, cols.size()].
std::vector<float> take_columns(const std::vector<float>& global, int64_t heads, int64_t total,
                                const std::vector<int64_t>& cols);

// bf16 (round to nearest even) <-> fp32, for the bf16 tests.
uint16_t to_bf16(float x);
float from_bf16(uint16_t bits);

// max|a - b| / max(max|b|, tiny): the relative error the project uses for fp32 comparisons.
double relative_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace cad_test
