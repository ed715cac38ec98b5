// prefix_aware.cpp -- the project's own balancer, "prefix_aware": communication-aware shedding.
//
// Start colocated and let an overloaded server shed only what lies above the bound
// U = mean*(1 + tolerance); receivers fill up to U, never past it, so the least work moves. Each step
// scores every (range the sender still computes) x (receiver) x (where the shard ends) by the exact
// forward bytes it adds per score entry moved, as plan_model counts them: Q out and O/LSE back, plus
// only the KV tokens the receiver does not already hold or receive for that document (one prefix per
// server and document). High shards carry the most work per query row; lower ones need a shorter KV
// prefix; shard_choice.h weighs the two. Receivers considered are the few with the most room plus
// those that already hold part of the document or its prefix. Shards and the pieces they leave are at
// least min_shard_tokens unless the range itself is shorter. A memory cap is respected exactly; if no
// receiver can take any shard under it, the call fails with UNSUPPORTED. A receiver pushed over U by a
// minimum-size shard sheds again in the next round.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <set>

#include "balancer_support.h"
#include "shard_choice.h"

namespace {

using cad::balancer::Ledger;
using cad::balancer::make_task;
using cad::balancer::Problem;
using cad::balancer::Range;
using cad::balancer::Tasks;
using cad::plugin::format;
using cad::prefix_aware::Shard;

constexpr int kRoomiestReceivers = 4;  // receivers with the most room considered at every step
constexpr int kMaxRounds = 8;          // rounds of shedding (a round ends when every sender has tried)

// One plan computation: the state of the greedy and its steps.
class Shedding {
 public:
  Shedding(const Problem& p, int64_t bound, int64_t min_shard, const cad::plugin::Logger& log)
      : p_(p), bound_(bound), min_shard_(min_shard), log_(log), ledger_(p), ranges_(cad::balancer::colocated_ranges(p)),
        doc_servers_(p.docs.size()) {
    for (int32_t s = 0; s < p_.num_servers; ++s) {
      if (room(s) > 0) by_room_.insert({-room(s), s});
    }
    for (size_t d = 0; d < p_.docs.size(); ++d) {
      for (const auto& span : p_.docs[d].spans) doc_servers_[d].push_back(span.rank);
    }
  }

  Tasks run() {
    int64_t excess_before = INT64_MAX;
    std::vector<int32_t> senders;
    for (int round = 0; round < kMaxRounds; ++round) {
      senders.clear();
      int64_t excess = 0;
      for (int32_t s = 0; s < p_.num_servers; ++s) {
        if (ledger_.load(s) > bound_) {
          senders.push_back(s);
          excess += ledger_.load(s) - bound_;
        }
      }
      if (senders.empty() || excess >= excess_before) break;  // balanced, or no progress
      excess_before = excess;
      std::sort(senders.begin(), senders.end(), [&](int32_t a, int32_t b) {
        return ledger_.load(a) != ledger_.load(b) ? ledger_.load(a) > ledger_.load(b) : a < b;
      });
      for (int32_t src : senders) shed(src);
    }
    for (int32_t s = 0; s < p_.num_servers; ++s) {
      for (const Range& r : ranges_[static_cast<size_t>(s)]) {
        tasks_.push_back(make_task(p_.docs[static_cast<size_t>(r.doc)].id, r.begin, r.end, s));
      }
    }
    return std::move(tasks_);
  }

 private:
  struct Candidate {
    bool valid = false;
    size_t range = 0;
    int32_t receiver = -1;
    Shard shard;
    int64_t cost = 0;
    double bytes_per_entry = 0;
  };

  // What stopped a sender when nothing could move: the cheapest shard the memory cap refused.
  struct MemoryBlock {
    bool blocked = false;
    int64_t bytes = 0;
    int32_t server = -1;
  };

  int64_t room(int32_t s) const { return bound_ - ledger_.load(s); }

  // Fewer bytes per entry first; exact ties broken by receiver, range order, then the higher shard.
  static bool better(const Candidate& a, const Candidate& b) {
    if (a.bytes_per_entry != b.bytes_per_entry) return a.bytes_per_entry < b.bytes_per_entry;
    if (a.receiver != b.receiver) return a.receiver < b.receiver;
    if (a.range != b.range) return a.range < b.range;
    return a.shard.end > b.shard.end;
  }

  // Moves shards off `src` until it is at or below the bound or nothing more can move.
  void shed(int32_t src) {
    auto& on_src = ranges_[static_cast<size_t>(src)];
    for (int64_t guard = 4 * static_cast<int64_t>(on_src.size()) + 64; ledger_.load(src) > bound_ && guard > 0;
         --guard) {
      MemoryBlock memory;
      const Candidate best = pick(src, memory);
      if (best.valid) {
        apply(src, best);
        continue;
      }
      const int64_t need = ledger_.load(src) - bound_;
      if (memory.blocked) {
        cad::plugin::fail(CAD_STATUS_UNSUPPORTED,
                          format("plan: server %d must shed %lld score entries, but the smallest shard it could "
                                 "move needs %lld more bytes on server %d (which holds %lld), over "
                                 "memory_cap_bytes = %lld",
                                 src, static_cast<long long>(need), static_cast<long long>(memory.bytes), memory.server,
                                 static_cast<long long>(ledger_.memory(memory.server)),
                                 static_cast<long long>(p_.memory_cap)));
      }
      log_.debug(format("server %d keeps %lld score entries over the bound: no shard fits", src,
                        static_cast<long long>(need)));
      return;
    }
  }

  // The best move off `src`: among (range) x (receiver) x (shard end), the fewest bytes per score
  // entry that fits the receiver's room; else (minimum-size shards) the one that most lowers the
  // larger of the two loads; else invalid.
  Candidate pick(int32_t src, MemoryBlock& memory) {
    const auto& on_src = ranges_[static_cast<size_t>(src)];
    const int64_t need = ledger_.load(src) - bound_;
    Candidate best, fallback;
    int64_t fallback_max = ledger_.load(src);
    for (size_t i = 0; i < on_src.size(); ++i) {
      const Range& r = on_src[i];
      receivers_.clear();
      int n = 0;
      for (auto it = by_room_.begin(); it != by_room_.end() && n < kRoomiestReceivers; ++it) {
        if (it->second != src) {
          receivers_.push_back(it->second);
          ++n;
        }
      }
      for (int32_t s : doc_servers_[static_cast<size_t>(r.doc)]) {
        if (s != src && room(s) > 0) receivers_.push_back(s);
      }
      for (int32_t dst : receivers_) {
        cad::prefix_aware::shard_ends(p_, r, ledger_, dst, std::min(need, room(dst)), ends_);
        for (int64_t e : ends_) {
          const Shard sh = cad::prefix_aware::shard_ending_at(p_, r, e, need, room(dst), min_shard_);
          if (sh.begin >= sh.end) continue;
          const int64_t c = p_.cost(sh.begin, sh.end, p_.docs[static_cast<size_t>(r.doc)]);
          if (c <= 0) continue;
          const Ledger::Delta delta = ledger_.delta(r.doc, sh.begin, sh.end, dst);
          if (!ledger_.fits_memory(dst, delta.memory)) {
            if (!memory.blocked || delta.memory < memory.bytes) memory = {true, delta.memory, dst};
            continue;
          }
          const Candidate cand{true, i, dst, sh, c, static_cast<double>(delta.bytes) / static_cast<double>(c)};
          if (c <= room(dst)) {
            if (!best.valid || better(cand, best)) best = cand;
          } else {
            const int64_t worst = std::max(ledger_.load(src) - c, ledger_.load(dst) + c);
            if (worst < fallback_max) {
              fallback_max = worst;
              fallback = cand;
            }
          }
        }
      }
    }
    return best.valid ? best : fallback;
  }

  void apply(int32_t src, const Candidate& c) {
    auto& on_src = ranges_[static_cast<size_t>(src)];
    const Range r = on_src[c.range];
    by_room_.erase({-room(c.receiver), c.receiver});
    by_room_.erase({-room(src), src});
    ledger_.commit(r.doc, c.shard.begin, c.shard.end, src, c.receiver);
    tasks_.push_back(make_task(p_.docs[static_cast<size_t>(r.doc)].id, c.shard.begin, c.shard.end, c.receiver));
    // What stays local: the part below the shard in place, the part above it appended.
    on_src[c.range].end = c.shard.begin;
    if (c.shard.end < r.end) on_src.push_back({r.doc, c.shard.end, r.end});
    if (c.shard.begin == r.begin) on_src.erase(on_src.begin() + static_cast<std::ptrdiff_t>(c.range));
    if (room(c.receiver) > 0) by_room_.insert({-room(c.receiver), c.receiver});
    if (room(src) > 0) by_room_.insert({-room(src), src});
    auto& holders = doc_servers_[static_cast<size_t>(r.doc)];
    if (std::find(holders.begin(), holders.end(), c.receiver) == holders.end()) holders.push_back(c.receiver);
  }

  const Problem& p_;
  const int64_t bound_;
  const int64_t min_shard_;
  const cad::plugin::Logger& log_;
  Ledger ledger_;
  std::vector<std::vector<Range>> ranges_;          // per server: query ranges it still computes itself
  std::vector<std::vector<int32_t>> doc_servers_;   // per document: servers holding tokens or its prefix
  std::set<std::pair<int64_t, int32_t>> by_room_;   // (-room, server) for servers below the bound
  Tasks tasks_;                                     // the shards moved so far
  std::vector<int32_t> receivers_;                  // scratch
  std::vector<int64_t> ends_;                       // scratch
};

struct PrefixAware {
  static constexpr const char* kName = "prefix_aware";
  static constexpr const char* kDescription =
      "moves shards above mean*(1+tolerance), fewest bytes per FLOP, KV prefixes deduplicated per server";
  double tolerance;
  int64_t min_shard_override;  // 0: use the cost params' min_shard_tokens

  explicit PrefixAware(cad::plugin::ConfigReader& config)
      : tolerance(config.get_double("tolerance", 0.02, 0.0, 10.0)),
        min_shard_override(config.get_int("min_shard_tokens", 0, 0, int64_t{1} << 40)) {}

  Tasks plan(const Problem& p, const cad::plugin::Logger& log) const {
    const std::vector<int64_t> loads = cad::plan::colocated_cost(p.ranks, p.model.causal);
    int64_t sum = 0;
    for (int64_t l : loads) sum += l;
    if (sum == 0) return cad::balancer::colocated_tasks(p);
    const double mean = static_cast<double>(sum) / p.num_servers;
    const int64_t bound =
        std::max(static_cast<int64_t>(std::ceil(mean)), static_cast<int64_t>(std::floor(mean * (1 + tolerance))));
    return Shedding(p, bound, min_shard_override > 0 ? min_shard_override : p.min_shard, log).run();
  }
};

}  // namespace

CAD_BALANCER_PLUGIN(PrefixAware)
