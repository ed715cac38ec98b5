// prefix_aware.cpp -- the project's own balancer, "prefix_aware": communication-aware shedding of tail
// shards.
//
// Start colocated and let an overloaded server shed only what lies above the bound U = mean*(1 + tolerance);
// receivers fill up to U, never past it. What moves is always the top of a range a sender still
// computes: a tail shard [a, end) carries the most attention work per query row (each row sees `end`
// keys), and the next shard of the same range needs a shorter KV prefix. Each step scores every
// (range, receiver) candidate by the exact forward bytes it adds per score entry moved, as plan_model
// counts them: Q out and O/LSE back, plus only the KV tokens the receiver does not already hold or
// receive for that document (a prefix is shipped once per server and document). Receivers considered
// are the few with the most room plus those that already hold part of the document or its prefix, so
// a long document tends to go to one receiver in one or two shards. Shards and the remainders they
// leave are at least min_shard_tokens unless the range itself is shorter. A memory cap is respected
// exactly; if no receiver can take any shard under it, the call fails with UNSUPPORTED.
#include <algorithm>
#include <cmath>
#include <set>

#include "balancer_support.h"

namespace {

using cad::balancer::Ledger;
using cad::balancer::Problem;
using cad::balancer::Range;
using cad::balancer::Tasks;
using cad::balancer::make_task;
using cad::plugin::format;

constexpr int kRoomiestReceivers = 4;  // receivers with the most room considered at every step

struct PrefixAware {
  static constexpr const char* kName = "prefix_aware";
  static constexpr const char* kDescription = "moves tail shards above mean*(1+tolerance), fewest bytes per "
                                              "FLOP, KV prefixes deduplicated per server";
  double tolerance;
  int64_t min_shard_override;  // 0: use the cost params' min_shard_tokens

  explicit PrefixAware(cad::plugin::ConfigReader& config)
      : tolerance(config.get_double("tolerance", 0.02, 0.0, 10.0)),
        min_shard_override(config.get_int("min_shard_tokens", 0, 0, int64_t{1} << 40)) {}

  // A shard [begin, end) of a range, or invalid (begin >= end).
  struct Shard {
    int64_t begin = 0;
    int64_t end = 0;
  };

  // The shard of range r that ends at `e` and moves about min(need, room) score entries: `need` is
  // what the sender must shed, `room` what the receiver can take. Shards and the pieces they leave
  // behind on either side are at least min_shard tokens unless the range itself is shorter.
  static Shard shard_ending_at(const Problem& p, const Range& r, int64_t e, int64_t need, int64_t room,
                               int64_t min_shard) {
    const auto& doc = p.docs[static_cast<size_t>(r.doc)];
    const int64_t b = r.begin;
    e = std::min(std::max(e, std::min(r.end, b + min_shard)), r.end);
    if (e < r.end && r.end - e < min_shard) e = r.end;  // no sliver above the shard
    auto cost = [&](int64_t a) { return p.cost(a, e, doc); };
    const int64_t target = std::min(need, room);
    int64_t a;
    if (cost(b) <= target) {
      a = b;  // all of [b, e) fits and is needed
    } else if (need <= room) {
      // The smallest shard that sheds `need`: the largest a with cost(a) >= need (cost falls as a grows).
      int64_t lo = b, hi = e - 1;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (cost(mid) >= need) lo = mid; else hi = mid - 1;
      }
      a = lo;
      if (cost(a) > room) ++a;  // one row too many for the receiver: shed a little less
    } else {
      // The largest shard the receiver can take: the smallest a with cost(a) <= room.
      int64_t lo = b, hi = e;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (cost(mid) <= room) hi = mid; else lo = mid + 1;
      }
      a = lo;
    }
    if (e - a < min_shard) a = std::max(b, e - min_shard);  // shard at least the minimum
    if (a > b && a - b < min_shard) {                        // no sliver below the shard
      if (cost(b) <= room || e - (b + min_shard) < min_shard) a = b;
      else a = b + min_shard;
    }
    return {a, e};
  }

  // Where a shard of range r for `dst` may best end: the range's top (most work per query row); the
  // end that balances query-row bytes against KV-prefix bytes (rows ~ target/e, prefix ~ e beyond what
  // dst already has); and the lowest end that still carries the whole target.
  static void shard_ends(const Problem& p, const Range& r, const Ledger& ledger, int32_t dst, int64_t target,
                         std::vector<int64_t>& ends) {
    ends.clear();
    ends.push_back(r.end);
    if (!p.model.causal) return;  // every shard needs the whole document: the top is as good as any
    const double rows_vs_kv = static_cast<double>(p.model.q_round_trip_bytes()) /
                              static_cast<double>(p.model.kv_token_bytes());
    const int64_t have = ledger.kv_prefix(r.doc, dst);
    const int64_t balanced = std::max<int64_t>(have, std::llround(std::sqrt(static_cast<double>(target) * rows_vs_kv)));
    if (balanced > r.begin && balanced < r.end) ends.push_back(balanced);
    const auto& doc = p.docs[static_cast<size_t>(r.doc)];
    if (p.cost(r.begin, r.end, doc) > target) {
      int64_t lo = r.begin + 1, hi = r.end;  // smallest e with cost(begin, e) >= target
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (p.cost(r.begin, mid, doc) >= target) hi = mid; else lo = mid + 1;
      }
      if (lo < r.end) ends.push_back(lo);
    }
  }

  struct Candidate {
    bool valid = false;
    size_t range = 0;
    int32_t receiver = -1;
    Shard shard;
    int64_t cost = 0;
    double bytes_per_entry = 0;
  };

  Tasks plan(const Problem& p, const cad::plugin::Logger& log) const {
    const int64_t min_shard = min_shard_override > 0 ? min_shard_override : p.min_shard;
    Ledger ledger(p);
    auto ranges = cad::balancer::colocated_ranges(p);
    Tasks tasks;
    int64_t total = 0;
    for (int64_t l : ledger.loads()) total += l;
    if (total == 0) return cad::balancer::colocated_tasks(p);
    const double mean = static_cast<double>(total) / p.num_servers;
    const int64_t bound = std::max(static_cast<int64_t>(std::ceil(mean)),
                                   static_cast<int64_t>(std::floor(mean * (1 + tolerance))));

    // Receivers ordered by room (most first, then lowest index) and, per document, the servers that
    // already hold some of its tokens or its KV prefix.
    std::set<std::pair<int64_t, int32_t>> by_room;
    auto room = [&](int32_t s) { return bound - ledger.load(s); };
    for (int32_t s = 0; s < p.num_servers; ++s) {
      if (room(s) > 0) by_room.insert({-room(s), s});
    }
    std::vector<std::vector<int32_t>> doc_servers(p.docs.size());
    for (size_t d = 0; d < p.docs.size(); ++d) {
      for (const auto& span : p.docs[d].spans) doc_servers[d].push_back(span.rank);
    }

    std::vector<int32_t> senders;
    for (int32_t s = 0; s < p.num_servers; ++s) {
      if (ledger.load(s) > bound) senders.push_back(s);
    }
    std::sort(senders.begin(), senders.end(), [&](int32_t a, int32_t b) {
      return ledger.load(a) != ledger.load(b) ? ledger.load(a) > ledger.load(b) : a < b;
    });

    std::vector<int32_t> receivers;
    std::vector<int64_t> ends;
    for (int32_t src : senders) {
      auto& on_src = ranges[static_cast<size_t>(src)];
      for (int64_t guard = 4 * static_cast<int64_t>(on_src.size()) + 64; ledger.load(src) > bound && guard > 0;
           --guard) {
        const int64_t need = ledger.load(src) - bound;
        Candidate best, fallback;
        int64_t fallback_max = ledger.load(src);  // a fallback must lower the larger of the two loads
        bool memory_blocked = false;
        int64_t memory_wanted = 0;
        int32_t memory_server = -1;
        for (size_t i = 0; i < on_src.size(); ++i) {
          const Range& r = on_src[i];
          receivers.clear();
          int n = 0;
          for (auto it = by_room.begin(); it != by_room.end() && n < kRoomiestReceivers; ++it) {
            if (it->second != src) { receivers.push_back(it->second); ++n; }
          }
          for (int32_t s : doc_servers[static_cast<size_t>(r.doc)]) {
            if (s != src && room(s) > 0) receivers.push_back(s);
          }
          for (int32_t dst : receivers) {
            shard_ends(p, r, ledger, dst, std::min(need, room(dst)), ends);
            for (int64_t e : ends) {
              const Shard sh = shard_ending_at(p, r, e, need, room(dst), min_shard);
              if (sh.begin >= sh.end) continue;
              const int64_t c = p.cost(sh.begin, sh.end, p.docs[static_cast<size_t>(r.doc)]);
              if (c <= 0) continue;
              const Ledger::Delta delta = ledger.delta(r.doc, sh.begin, sh.end, dst);
              if (!ledger.fits_memory(dst, delta.memory)) {
                if (!memory_blocked || delta.memory < memory_wanted) {
                  memory_wanted = delta.memory;
                  memory_server = dst;
                }
                memory_blocked = true;
                continue;
              }
              const Candidate cand{true, i, dst, sh, c, static_cast<double>(delta.bytes) / static_cast<double>(c)};
              if (c <= room(dst)) {
                if (!best.valid || better(cand, best)) best = cand;
              } else {
                // Over the receiver's room (a minimum-size shard): only if it lowers the larger load.
                const int64_t worst = std::max(ledger.load(src) - c, ledger.load(dst) + c);
                if (worst < fallback_max) {
                  fallback_max = worst;
                  fallback = cand;
                }
              }
            }
          }
        }
        if (!best.valid) best = fallback;
        if (!best.valid) {
          if (memory_blocked) {
            cad::plugin::fail(CAD_STATUS_UNSUPPORTED,
                              format("plan: server %d must shed %lld score entries, but the smallest shard it could "
                                     "move needs %lld more bytes on server %d (which holds %lld), over "
                                     "memory_cap_bytes = %lld", src, static_cast<long long>(need),
                                     static_cast<long long>(memory_wanted), memory_server,
                                     static_cast<long long>(ledger.memory(memory_server)),
                                     static_cast<long long>(p.memory_cap)));
          }
          log.debug(format("server %d keeps %lld score entries over the bound: no shard fits", src,
                           static_cast<long long>(need)));
          break;
        }
        apply(p, best, src, ranges, ledger, tasks, by_room, doc_servers, room);
      }
    }
    for (int32_t s = 0; s < p.num_servers; ++s) {
      for (const Range& r : ranges[static_cast<size_t>(s)]) {
        tasks.push_back(make_task(p.docs[static_cast<size_t>(r.doc)].id, r.begin, r.end, s));
      }
    }
    return tasks;
  }

  // Fewer bytes per entry first; exact ties broken by receiver, range order, then the higher shard.
  static bool better(const Candidate& a, const Candidate& b) {
    if (a.bytes_per_entry != b.bytes_per_entry) return a.bytes_per_entry < b.bytes_per_entry;
    if (a.receiver != b.receiver) return a.receiver < b.receiver;
    if (a.range != b.range) return a.range < b.range;
    return a.shard.end > b.shard.end;
  }

  template <class Room>
  static void apply(const Problem& p, const Candidate& c, int32_t src, std::vector<std::vector<Range>>& ranges,
                    Ledger& ledger, Tasks& tasks, std::set<std::pair<int64_t, int32_t>>& by_room,
                    std::vector<std::vector<int32_t>>& doc_servers, const Room& room) {
    auto& on_src = ranges[static_cast<size_t>(src)];
    const Range r = on_src[c.range];
    by_room.erase({-room(c.receiver), c.receiver});
    by_room.erase({-room(src), src});
    ledger.commit(r.doc, c.shard.begin, c.shard.end, src, c.receiver);
    tasks.push_back(make_task(p.docs[static_cast<size_t>(r.doc)].id, c.shard.begin, c.shard.end, c.receiver));
    // What stays local: the part below the shard in place, the part above it appended.
    on_src[c.range].end = c.shard.begin;
    if (c.shard.end < r.end) on_src.push_back({r.doc, c.shard.end, r.end});
    if (c.shard.begin == r.begin) on_src.erase(on_src.begin() + static_cast<std::ptrdiff_t>(c.range));
    if (room(c.receiver) > 0) by_room.insert({-room(c.receiver), c.receiver});
    if (room(src) > 0) by_room.insert({-room(src), src});
    auto& holders = doc_servers[static_cast<size_t>(r.doc)];
    if (std::find(holders.begin(), holders.end(), c.receiver) == holders.end()) holders.push_back(c.receiver);
  }
};

}  // namespace

CAD_BALANCER_PLUGIN(PrefixAware)
