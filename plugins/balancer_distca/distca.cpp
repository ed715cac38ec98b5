// distca.cpp -- the "distca" balancer: the greedy scheduler of DistCA (arXiv 2510.18121), as a baseline.
//
// Start colocated. Repeatedly take the most loaded server (surplus over the mean) and the least loaded
// one (deficit); among the work ranges on the surplus server pick the move with the most FLOPs per
// byte, where the amount moved is min(surplus, deficit) and a range is split as a head/tail pair: k
// queries from its head and k from its tail, so that every moved query pair costs exactly
// begin + end + 1 score entries (doc_len + 1 for a whole document). Bytes are estimated the way the
// paper's scheduler does: the moved Q rows plus the whole KV prefix the tail needs, with no credit for
// prefixes the destination already has. Stop when every server is within `tolerance` of the mean.
#include <cmath>

#include "balancer_support.h"

namespace {

using cad::balancer::Ledger;
using cad::balancer::Problem;
using cad::balancer::Range;
using cad::balancer::Tasks;
using cad::balancer::make_task;

struct DistCa {
  static constexpr const char* kName = "distca";
  static constexpr const char* kDescription = "DistCA's greedy: head/tail pairs from surplus to deficit servers, "
                                              "most FLOPs per byte first";
  double tolerance;

  explicit DistCa(cad::plugin::ConfigReader& config) : tolerance(config.get_double("tolerance", 0.1, 0.0, 10.0)) {}

  // One candidate move: k head/tail pairs of a range (or the whole range when k == 0).
  struct Move {
    size_t range = 0;
    int64_t k = 0;
    int64_t cost = 0;
    double flops_per_byte = -1;
  };

  Move size_move(const Problem& p, const Range& r, double want) const {
    const auto& doc = p.docs[static_cast<size_t>(r.doc)];
    const int64_t len = r.end - r.begin;
    const int64_t whole = p.cost(r.begin, r.end, doc);
    const int64_t pair_cost = p.model.causal ? r.begin + r.end + 1 : 2 * doc.len;
    Move m;
    if (want >= static_cast<double>(whole) || len < 2) {
      m.cost = whole;
    } else {
      m.k = std::max<int64_t>(1, std::llround(want / static_cast<double>(pair_cost)));
      m.k = std::max(m.k, p.min_shard);                       // shards at or above the kernel's minimum
      if (len - 2 * m.k < p.min_shard) m.k = 0;               // a remainder too small: move it all
      m.cost = m.k == 0 ? whole : m.k * pair_cost;
    }
    const int64_t rows = m.k == 0 ? len : 2 * m.k;
    const int64_t kv = p.model.causal ? r.end : doc.len;
    const double bytes = static_cast<double>(rows * p.model.q_round_trip_bytes() + kv * p.model.kv_token_bytes());
    m.flops_per_byte = static_cast<double>(m.cost) / bytes;
    return m;
  }

  Tasks plan(const Problem& p, const cad::plugin::Logger& log) const {
    Ledger ledger(p);
    auto ranges = cad::balancer::colocated_ranges(p);
    Tasks tasks;
    int64_t total = 0;
    for (int64_t l : ledger.loads()) total += l;
    const double mean = static_cast<double>(total) / p.num_servers;
    const double high = mean * (1 + tolerance);
    const double low = mean * (1 - tolerance);
    int64_t max_steps = 64 * int64_t{p.num_servers} + 4 * static_cast<int64_t>(p.docs.size()) + 64;

    while (total > 0 && max_steps-- > 0) {
      int32_t src = 0, dst = 0;
      for (int32_t s = 1; s < p.num_servers; ++s) {
        if (ledger.load(s) > ledger.load(src)) src = s;
        if (ledger.load(s) < ledger.load(dst)) dst = s;
      }
      const double surplus = static_cast<double>(ledger.load(src)) - mean;
      const double deficit = mean - static_cast<double>(ledger.load(dst));
      if ((ledger.load(src) <= high && ledger.load(dst) >= low) || surplus <= 0 || deficit <= 0) break;

      auto& on_src = ranges[static_cast<size_t>(src)];
      Move best;
      for (size_t i = 0; i < on_src.size(); ++i) {
        Move m = size_move(p, on_src[i], std::min(surplus, deficit));
        m.range = i;
        const Range& r = on_src[i];
        const int64_t tail_begin = m.k == 0 ? r.begin : r.end - m.k;
        int64_t memory = ledger.delta(r.doc, tail_begin, r.end, dst).memory;
        if (m.k != 0) memory += m.k * p.model.q_memory_bytes();
        if (!ledger.fits_memory(dst, memory)) continue;
        if (m.flops_per_byte > best.flops_per_byte) best = m;
      }
      if (best.flops_per_byte < 0) {
        log.debug(cad::plugin::format("no movable work on server %d fits server %d; stopping", src, dst));
        break;
      }
      Range& r = on_src[best.range];
      const int64_t doc_id = p.docs[static_cast<size_t>(r.doc)].id;
      if (best.k == 0) {
        ledger.commit(r.doc, r.begin, r.end, src, dst);
        tasks.push_back(make_task(doc_id, r.begin, r.end, dst));
        on_src.erase(on_src.begin() + static_cast<std::ptrdiff_t>(best.range));
      } else {
        ledger.commit(r.doc, r.end - best.k, r.end, src, dst);
        ledger.commit(r.doc, r.begin, r.begin + best.k, src, dst);
        tasks.push_back(make_task(doc_id, r.end - best.k, r.end, dst));
        tasks.push_back(make_task(doc_id, r.begin, r.begin + best.k, dst));
        r.begin += best.k;
        r.end -= best.k;
      }
    }
    for (int32_t s = 0; s < p.num_servers; ++s) {
      for (const Range& r : ranges[static_cast<size_t>(s)]) {
        tasks.push_back(make_task(p.docs[static_cast<size_t>(r.doc)].id, r.begin, r.end, s));
      }
    }
    return tasks;
  }
};

}  // namespace

CAD_BALANCER_PLUGIN(DistCa)
