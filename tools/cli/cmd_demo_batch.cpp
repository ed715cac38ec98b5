// cmd_demo_batch.cpp -- see demo_batch.h.
#include "demo_batch.h"

#include <filesystem>
#include <random>
#include <set>

#include "doc_lengths.h"

namespace cad::demo {
namespace {

// Where the Pretrain distribution sits when --dist is not given: the shared data folder beside the
// checkout, seen from the working directory (the README runs from the repository root) or from the
// source tree this binary was built from.
std::vector<std::string> default_dist_candidates() {
  return {"../shared/data/doclen_pretrain.json",
#ifdef CAD_SOURCE_CONFIG_DIR
          CAD_SOURCE_CONFIG_DIR "/../../shared/data/doclen_pretrain.json",
#endif
  };
}

// Random documents (lengths uniform in [1, 2 * context]) packed like the recipe: the fallback batch.
cad::workload::RankPieces random_batch(int64_t context, int32_t world, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> docs;
  int64_t total = 0;
  while (total < context * world) {
    // mt19937_64's output is the same everywhere (unlike std:: distributions), so is this batch.
    const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * context));
    docs.push_back(len);
    total += len;
  }
  return cad::workload::pack(docs, context, world);
}

int64_t count_documents(const cad::workload::RankPieces& ranks) {
  std::set<int64_t> ids;
  for (const auto& pieces : ranks) {
    for (const auto& p : pieces) ids.insert(p.doc_id);
  }
  return static_cast<int64_t>(ids.size());
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Fills `tensor`'s rows (one per token of `pieces`, `width` values each) for tensor number `which`.
void fill(Tensor& tensor, const std::vector<cad_piece_v1_t>& pieces, int64_t width, uint64_t seed, uint64_t which) {
  const uint64_t tensor_key = splitmix64(splitmix64(seed) ^ which);
  size_t at = 0;
  for (const auto& p : pieces) {
    const uint64_t doc_key = splitmix64(tensor_key ^ static_cast<uint64_t>(p.doc_id));
    for (int64_t t = p.offset_in_doc; t < p.offset_in_doc + p.len; ++t) {
      const uint64_t row_key = splitmix64(doc_key ^ static_cast<uint64_t>(t));
      for (int64_t e = 0; e < width; ++e) {
        // The top 24 bits as a float in [0, 1), mapped to [-1, 1): exact in fp32.
        const uint64_t bits = splitmix64(row_key + static_cast<uint64_t>(e)) >> 40;
        tensor.data[at++] = static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
      }
    }
  }
}

}  // namespace

Batch make_batch(const BatchOptions& options, int32_t world) {
  Batch batch;
  std::string path = options.dist;
  if (path.empty()) {
    std::string tried;
    for (const auto& candidate : default_dist_candidates()) {
      std::error_code ec;
      if (std::filesystem::is_regular_file(candidate, ec)) {
        path = std::filesystem::path(candidate).lexically_normal().string();
        break;
      }
      tried += (tried.empty() ? "" : ", ") + candidate;
    }
    if (path.empty()) {
      batch.notes.push_back("the Pretrain distribution is missing (looked for " + tried +
                            "): using RANDOM documents instead (give --dist FILE for the Pretrain batch)");
      batch.pieces = random_batch(options.context, world, options.seed);
      batch.source = "random documents (lengths uniform in [1, " + std::to_string(2 * options.context) + "])";
    }
  }
  if (!path.empty()) {
    std::vector<int64_t> lengths;
    try {
      lengths = cad::workload::load_lengths(path);  // names the file and the bad entry
    } catch (const cad::workload::LengthsError& e) {
      throw cad::workload::LengthsError(std::string(options.dist.empty() ? "Pretrain distribution " : "--dist ") +
                                        e.what());
    }
    batch.pieces = cad::workload::sample_batch(lengths, options.context, world, options.seed);
    batch.source = "Pretrain (" + path + ", " + std::to_string(lengths.size()) + " lengths), DistCA recipe";
  }
  batch.documents = count_documents(batch.pieces);
  return batch;
}

Inputs fill_inputs(const std::vector<cad_piece_v1_t>& pieces, int64_t heads, int64_t kv_heads, int64_t head_dim,
                   uint64_t seed) {
  int64_t tokens = 0;
  for (const auto& p : pieces) tokens += p.len;
  Inputs in{Tensor({tokens, heads, head_dim}), Tensor({tokens, kv_heads, head_dim}),
            Tensor({tokens, kv_heads, head_dim}), Tensor({tokens, heads, head_dim})};
  fill(in.q, pieces, heads * head_dim, seed, 0);
  fill(in.k, pieces, kv_heads * head_dim, seed, 1);
  fill(in.v, pieces, kv_heads * head_dim, seed, 2);
  fill(in.d_o, pieces, heads * head_dim, seed, 3);
  return in;
}

}  // namespace cad::demo
