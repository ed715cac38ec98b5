// fuzz_doc_lengths.cpp -- the document-length reader (tools/workload/doc_lengths.cpp, JSON and
// CSV) and what `cad plan` does next with the lengths it accepts: pack them into ranks and ask whether
// the cost model can represent the batch. Accepted lengths must lie in [1, kMaxDocumentTokens].
#include <string>

#include "batch_recipe.h"
#include "doc_lengths.h"
#include "fuzz_input.h"
#include "plan_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cad::fuzz::Input in(data, size);
  const uint8_t mode = in.take<uint8_t>();
  const std::string text = in.rest();
  std::vector<int64_t> lengths;
  try {
    lengths = (mode & 1) ? cad::workload::parse_lengths_json(text, "fuzz.json")
                         : cad::workload::parse_lengths_csv(text, "fuzz.csv");
  } catch (const cad::workload::LengthsError& e) {
    if (std::string(e.what()).rfind("fuzz.", 0) != 0) cad::fuzz::broken("a lengths error not naming the file");
    return 0;
  }
  for (int64_t l : lengths) {
    if (l < 1 || l > cad::workload::kMaxDocumentTokens) cad::fuzz::broken("a length outside [1, 2^40] accepted");
  }
  if (lengths.empty() || lengths.size() > 256) return 0;
  const int32_t ranks = 1 + (mode >> 1) % 4;
  const auto pieces = cad::workload::pack(lengths, int64_t{1} << ((mode >> 3) % 20), ranks);
  cad::plan::ModelParams params;
  (void)cad::plan::model_overflow(pieces, ranks, params);  // must not overflow itself (UBSan)
  return 0;
}
