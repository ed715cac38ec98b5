// per_doc_cp.cpp -- the "per_doc_cp" balancer: per-document context parallelism as TransformerEngine
// does it. Every document is cut into 2N chunks (N servers) as evenly as possible and server r gets
// chunks r and 2N-1-r, so that each server holds one cheap head chunk and one expensive tail chunk.
// Chunks of length 0 (documents shorter than 2N) are omitted. Ignores min_shard_tokens: this is the
// baseline as it is used in practice.
#include "balancer_support.h"

namespace {

using cad::balancer::Tasks;

struct PerDocCp {
  static constexpr const char* kName = "per_doc_cp";
  static constexpr const char* kDescription = "every document cut into 2N chunks, server r gets chunks r and 2N-1-r";

  explicit PerDocCp(cad::plugin::ConfigReader&) {}  // no keys

  Tasks plan(const cad::balancer::Problem& problem, const cad::plugin::Logger&) const {
    const int64_t chunks = 2 * int64_t{problem.num_servers};
    Tasks tasks;
    for (const auto& doc : problem.docs) {
      // The first len % chunks chunks get one token more.
      const int64_t base = doc.len / chunks;
      const int64_t extra = doc.len % chunks;
      int64_t begin = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t end = begin + base + (c < extra ? 1 : 0);
        if (end > begin) {
          const int64_t server = c < problem.num_servers ? c : chunks - 1 - c;
          tasks.push_back(cad::balancer::make_task(doc.id, begin, end, static_cast<int32_t>(server)));
        }
        begin = end;
      }
    }
    return tasks;
  }
};

}  // namespace

CAD_BALANCER_PLUGIN(PerDocCp)
