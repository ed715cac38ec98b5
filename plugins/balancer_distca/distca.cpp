// distca.cpp -- the "distca" balancer: DistCA's planner (arXiv 2510.18121; hao-ai-lab/DistCA,
// distca/planner/planner.py, Planner.plan_items and Item.split_item), as the baseline prefix_aware is
// measured against. Written from reading that code; where ours differs, docs/balancers.md says why.
//
// Every piece a rank holds is an item. Servers below the mean are recipients, served largest deficit
// first; each takes work until its deficit is at most tolerance x mean. For each move, every item on
// any server above the mean (a donor) is a candidate, priced as DistCA prices it: the amount it could
// move, f = min(donor surplus, recipient need, item work), and bytes per unit of work
// (f / pair_cost query rows + the document's whole KV, doc_len + 1 tokens) / f, with Q and KV
// element counts as DistCA counts them (no O/LSE, no credit for KV already there); the cheapest
// wins, ties to the earlier item. An item whose work is at most f moves whole. Otherwise
// k = floor(f / pair_cost) query pairs move, cut next to the middle of the item: the first cut takes
// rows [m - k, m + k) around the middle m, later cuts the k rows on either side of the hole left by
// the earlier ones, so every pair costs the same (hole_begin + hole_end + 1 score entries; doc_len + 1
// for a whole even-length document) and the recipient needs the KV prefix only up to the hole's top.
// If k is 0 the recipient is done (DistCA stops there too). Moved rows are never moved again.
//
// Beyond DistCA: shards and the parts left are at least min_shard_tokens (k is lowered to keep them,
// or the move is dropped: with min_shard_tokens = 1 the rows are DistCA's), and a candidate that would
// put its recipient over memory_cap_bytes is skipped.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "balancer_support.h"

namespace {

using cad::balancer::Ledger;
using cad::balancer::make_task;
using cad::balancer::Problem;
using cad::balancer::Tasks;

// One piece of one document on its owner, and the middle rows already moved away: the item still
// computes [begin, hole_begin) and [hole_end, end) on `server`.
struct Item {
  int32_t doc = 0;
  int32_t server = 0;
  int64_t begin = 0, end = 0;
  int64_t hole_begin = 0, hole_end = 0;
  int64_t work = 0;  // score entries left
};

// The rows a move takes: whole (the item changes server) or k pairs next to the hole.
struct Cut {
  bool whole = false;
  int64_t k = 0;
  int64_t work = 0;
};

struct DistCa {
  static constexpr const char* kName = "distca";
  static constexpr const char* kDescription =
      "DistCA's planner: recipients filled to tolerance x mean, cheapest bytes per FLOP first, pairs cut next to "
      "the middle of a piece";
  double tolerance;

  explicit DistCa(cad::plugin::ConfigReader& config) : tolerance(config.get_double("tolerance", 0.1, 0.0, 10.0)) {}

  static int64_t work_of(const Problem& p, const Item& it) {
    const auto& doc = p.docs[static_cast<size_t>(it.doc)];
    return p.cost(it.begin, it.hole_begin, doc) + p.cost(it.hole_end, it.end, doc);
  }

  // The cost of one moved query pair (a row below the hole and one above it). Under a sliding window a
  // pair's cost is not constant (a row costs min(p + 1, left + 1) causal): the innermost pair's, at least 1,
  // prices k, and the cut's work is then summed exactly (cut()).
  static int64_t pair_cost(const Problem& p, const Item& it) {
    const auto& doc = p.docs[static_cast<size_t>(it.doc)];
    if (p.model.windowed()) {
      const int64_t below = it.hole_begin > it.begin ? p.cost(it.hole_begin - 1, it.hole_begin, doc) : 0;
      const int64_t above = it.hole_end < it.end ? p.cost(it.hole_end, it.hole_end + 1, doc) : 0;
      return std::max<int64_t>(1, below + above);
    }
    return p.model.causal ? it.hole_begin + it.hole_end + 1 : 2 * doc.len;
  }

  // DistCA's Item.get_priority: estimated elements moved per unit of work (lower is better).
  static double priority(const Problem& p, const Item& it, double f) {
    const auto& m = p.model;
    const double hidden = static_cast<double>(m.num_q_heads) * m.head_dim;
    const double kv_tokens = static_cast<double>(p.docs[static_cast<size_t>(it.doc)].len + 1);
    const double kv = 2.0 * kv_tokens * m.num_kv_heads * m.head_dim;
    const double pairs = f / static_cast<double>(pair_cost(p, it));
    return (pairs * hidden + kv) / f;
  }

  // DistCA's Item.split_item, with our minimum shard size: what moving `f` units of `it` takes.
  static Cut cut(const Problem& p, const Item& it, double f) {
    Cut c;
    if (f >= static_cast<double>(it.work)) return {true, 0, it.work};
    const int64_t pair = pair_cost(p, it);
    int64_t k = static_cast<int64_t>(f / static_cast<double>(pair));
    k = std::min({k, it.hole_begin - it.begin, it.end - it.hole_end});
    const int64_t below = it.hole_begin - it.begin, above = it.end - it.hole_end;
    auto sliver = [&](int64_t left) { return left > 0 && left < p.min_shard; };
    while (k > 0 && (sliver(below - k) || sliver(above - k))) {
      k = std::min(sliver(below - k) ? below - p.min_shard : k, sliver(above - k) ? above - p.min_shard : k);
    }
    const bool first = it.hole_begin == it.hole_end;  // the first cut moves one shard of 2k rows
    if (k <= 0 || (first ? 2 * k : k) < p.min_shard) return c;
    c.k = k;
    c.work = p.model.causal && !p.model.windowed() ? k * pair : 0;
    if (!p.model.causal || p.model.windowed()) {
      const auto& doc = p.docs[static_cast<size_t>(it.doc)];
      c.work = p.cost(it.hole_begin - k, it.hole_begin, doc) + p.cost(it.hole_end, it.hole_end + k, doc);
    }
    return c;
  }

  // Foreign Q/K/V/O bytes the recipient would hold in addition (the higher part's delta covers the KV
  // prefix of both; the lower part adds its query rows).
  static int64_t memory_of(const Problem& p, const Ledger& ledger, const Item& it, const Cut& c, int32_t dst) {
    int64_t lo_b, lo_e, hi_b, hi_e;
    if (c.whole) {
      lo_b = it.begin, lo_e = it.hole_begin, hi_b = it.hole_end, hi_e = it.end;
    } else {
      lo_b = it.hole_begin - c.k, lo_e = it.hole_begin, hi_b = it.hole_end, hi_e = it.hole_end + c.k;
    }
    if (hi_e <= hi_b) return ledger.delta(it.doc, lo_b, lo_e, dst).memory;
    return ledger.delta(it.doc, hi_b, hi_e, dst).memory + (lo_e - lo_b) * p.model.q_memory_bytes();
  }

  static void move(const Problem& p, Ledger& ledger, Tasks& tasks, int64_t b, int64_t e, const Item& it, int32_t dst) {
    if (b >= e) return;
    ledger.commit(it.doc, b, e, it.server, dst);
    tasks.push_back(make_task(p.docs[static_cast<size_t>(it.doc)].id, b, e, dst));
  }

  Tasks plan(const Problem& p, const cad::plugin::Logger& log) const {
    Ledger ledger(p);
    // Items in the host's order: by rank, then the rank's own piece order (DistCA's batch order).
    std::vector<Item> items;
    for (int32_t r = 0; r < p.num_ranks; ++r) {
      for (const auto& piece : p.ranks[static_cast<size_t>(r)]) {
        Item it;
        const auto found = std::lower_bound(p.docs.begin(), p.docs.end(), piece.doc_id,
                                            [](const cad::balancer::Doc& d, int64_t id) { return d.id < id; });
        it.doc = static_cast<int32_t>(found - p.docs.begin());
        it.server = r;
        it.begin = piece.offset_in_doc;
        it.end = piece.offset_in_doc + piece.len;
        it.hole_begin = it.hole_end = it.begin + (piece.len + 1) / 2;  // the head keeps the larger half
        it.work = work_of(p, it);
        items.push_back(it);
      }
    }
    int64_t total = 0;
    for (int64_t l : ledger.loads()) total += l;
    const double mean = static_cast<double>(total) / p.num_servers;
    const double threshold = mean * tolerance;
    std::vector<double> surplus(static_cast<size_t>(p.num_servers));
    std::vector<int32_t> recipients;
    for (int32_t s = 0; s < p.num_servers; ++s) {
      surplus[static_cast<size_t>(s)] = static_cast<double>(ledger.load(s)) - mean;
      if (surplus[static_cast<size_t>(s)] < 0) recipients.push_back(s);
    }
    std::stable_sort(recipients.begin(), recipients.end(), [&](int32_t a, int32_t b) {
      return surplus[static_cast<size_t>(a)] < surplus[static_cast<size_t>(b)];
    });

    Tasks tasks;
    for (int32_t dst : recipients) {
      double needed = -surplus[static_cast<size_t>(dst)];
      while (needed > threshold) {
        // The cheapest movable item on any donor; the earlier item wins ties (DistCA's stable sort).
        size_t best = items.size();
        double best_priority = 0;
        Cut best_cut;
        for (size_t i = 0; i < items.size(); ++i) {
          const Item& it = items[i];
          const double donor = surplus[static_cast<size_t>(it.server)];
          if (donor <= 0 || it.work <= 0) continue;
          const double f = std::min({donor, needed, static_cast<double>(it.work)});
          const double prio = priority(p, it, f);
          if (best < items.size() && prio >= best_priority) continue;
          const Cut c = cut(p, it, f);
          if (p.memory_cap != 0 && (c.whole || c.k > 0) && !ledger.fits_memory(dst, memory_of(p, ledger, it, c, dst))) {
            continue;  // not DistCA: it has no memory model
          }
          best = i;
          best_priority = prio;
          best_cut = c;
        }
        if (best == items.size() || (!best_cut.whole && best_cut.k == 0)) break;  // nothing (more) moves here
        Item& it = items[best];
        const int32_t donor = it.server;
        if (best_cut.whole) {
          move(p, ledger, tasks, it.begin, it.hole_begin, it, dst);
          move(p, ledger, tasks, it.hole_end, it.end, it, dst);
          it.begin = it.hole_begin = it.hole_end = it.end;  // nothing left to move from it
        } else {
          move(p, ledger, tasks, it.hole_begin - best_cut.k, it.hole_begin, it, dst);
          move(p, ledger, tasks, it.hole_end, it.hole_end + best_cut.k, it, dst);
          it.hole_begin -= best_cut.k;
          it.hole_end += best_cut.k;
        }
        it.work = work_of(p, it);
        surplus[static_cast<size_t>(donor)] -= static_cast<double>(best_cut.work);
        surplus[static_cast<size_t>(dst)] += static_cast<double>(best_cut.work);
        needed -= static_cast<double>(best_cut.work);
      }
      if (needed > threshold) {
        log.debug(cad::plugin::format("server %d stays %.0f score entries below the mean", dst, needed));
      }
    }
    for (const Item& it : items) {
      const int64_t id = p.docs[static_cast<size_t>(it.doc)].id;
      if (it.begin < it.hole_begin) tasks.push_back(make_task(id, it.begin, it.hole_begin, it.server));
      if (it.hole_end < it.end) tasks.push_back(make_task(id, it.hole_end, it.end, it.server));
    }
    return tasks;
  }
};

}  // namespace

CAD_BALANCER_PLUGIN(DistCa)
