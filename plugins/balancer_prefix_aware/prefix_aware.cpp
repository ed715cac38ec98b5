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
// least min_shard_tokens unless the range itself is shorter. A receiver pushed over U by a
// minimum-size shard sheds again in the next round.
//
// Topology (config "ranks_per_node", "inter_node_byte_cost": balancer_topology.h): over several nodes the
// shedding runs in three passes. First only the node-level surplus crosses nodes: a server above the bound
// sheds no more than what its node holds beyond its servers' bounds, to servers of other nodes, each node
// taking no more than its room; this pass goes first because the overloaded node's heaviest servers then
// still hold their most work-dense shards, the fewest bytes per entry to send across. Then every node
// balances inside itself (receivers on the sender's node only), then anything left goes anywhere. A byte
// that leaves its node is priced at inter_node_byte_cost bytes throughout, so receivers on the node that
// already hold part of a document win where there is a choice. With one node (the default) only the last
// pass runs: the plan is the one before.
//
// Time, not FLOPs (config "rate_table"): with a measured kernel-rate table every cost is in dense-rate
// score entries (plan_time.h), so equal loads are equal predicted time; cutting a range then costs a
// little extra time (its parts run slower than the whole), which the sender's load is charged with,
// and among moves within 1% of the best bytes per unit of work the one that adds the least time wins.
// Shards are then at least the table's shortest priced shard (RateTable::shortest_priced_shard).
// The greedy's binary searches ask for the same shard's time-weighted cost about five times each,
// so a plan call keeps a memo of them (plan_time.h, TimeCostMemo); "cost_memo": false (for tests)
// computes every cost afresh, which must give the same plan.
// The table's error per server (about 2% at 128K tokens per server) can exceed the gain it predicts, so
// time mode also makes the FLOP-balanced plan, prices both with the table, and returns the time-balanced
// one only if it predicts a max/mean lower by more than "min_time_gain" (default 1.5%). On one H200,
// with the runtime's min_shard_tokens 0, time plans won on Pretrain 8 x 32K and 8/16 x 64K batches
// (predicted gains mostly 1.5-4.3%) and lost on the mean at 8 x 128K (0.3-1.4%); docs/balancers.md.
//
// Memory cap: a move is taken only if the receiver stays under the cap. When no considered receiver
// can take a shard, every server with room is tried, with shards cut to fit its memory headroom (lower
// ends need shorter KV prefixes, fewer rows fewer Q/O bytes). A sender nothing fits keeps its excess
// (balance degrades, a warning says so) and the others go on: whenever the colocated plan fits the cap
// a plan is returned. If the colocated plan itself exceeds it (documents the host split across ranks
// need KV from other ranks), the call fails UNSUPPORTED naming the server and why.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
constexpr int kAcrossReceivers = 8;    // the same across nodes (where bytes cost most, a wider choice pays)
constexpr int kMaxRounds = 8;          // rounds of shedding (a round ends when every sender has tried)
constexpr double kSameBytes = 0.01;    // bytes per unit of work this close count as equal (time mode)

// One plan computation: the state of the greedy and its steps.
class Shedding {
 public:
  Shedding(const Problem& p, double tolerance, int64_t min_shard, bool fair_memory, const cad::plugin::Logger& log)
      : p_(p), tolerance_(tolerance), min_shard_(min_shard), fair_memory_(fair_memory), log_(log), ledger_(p),
        ranges_(cad::balancer::colocated_ranges(p)), doc_servers_(p.docs.size()) {
    raise_bound();
    for (size_t d = 0; d < p_.docs.size(); ++d) {
      for (const auto& span : p_.docs[d].spans) doc_servers_[d].push_back(span.rank);
    }
  }

  // After run(): the largest load, and the server the memory cap kept furthest above the bound (-1: none).
  int64_t max_load() const { return *std::max_element(ledger_.loads().begin(), ledger_.loads().end()); }
  int32_t worst_stuck() const { return worst_stuck_; }
  // The warning that the cap cost balance, for the plan that is returned ("" when it did not).
  std::string memory_bound_warning() const {
    if (worst_stuck_ < 0) return "";
    const int64_t total = std::accumulate(ledger_.loads().begin(), ledger_.loads().end(), int64_t{0});
    return format("memory_cap_bytes = %lld keeps server %d %.1f%% above the balance bound (max/mean %.3f): no "
                  "more of its work fits any receiver's memory; the plan fits the cap",
                  static_cast<long long>(p_.memory_cap), worst_stuck_,
                  100.0 * static_cast<double>(ledger_.load(worst_stuck_) - bound_) / static_cast<double>(bound_),
                  static_cast<double>(max_load()) * p_.num_servers / static_cast<double>(total));
  }

  Tasks run() {
    if (p_.nodes.multi_node(p_.num_servers)) {
      node_load_.assign(static_cast<size_t>(p_.nodes.num_nodes(p_.num_servers)), 0);
      for (int32_t n = 0; n < p_.nodes.num_nodes(p_.num_servers); ++n) sum_node_load(n * p_.nodes.ranks_per_node);
      // The node-level surplus first, while the servers of an overloaded node still hold their most
      // work-dense shards (the fewest bytes per entry to send across); then each node inside itself.
      pass_ = Pass::kAcrossNodes;
      shed_rounds();
      pass_ = Pass::kInsideNode;
      shed_rounds();
      pass_ = Pass::kAny;
      memory_stuck_.clear();  // the last pass tries every stuck sender again
    }
    shed_rounds();
    for (int32_t s : memory_stuck_) {
      if (ledger_.load(s) <= bound_) continue;
      if (worst_stuck_ < 0 || ledger_.load(s) > ledger_.load(worst_stuck_)) worst_stuck_ = s;
    }
    for (int32_t s = 0; s < p_.num_servers; ++s) {
      for (const Range& r : ranges_[static_cast<size_t>(s)]) {
        tasks_.push_back(make_task(p_.docs[static_cast<size_t>(r.doc)].id, r.begin, r.end, s));
      }
    }
    return std::move(tasks_);
  }

 private:
  // Rounds of shedding until every server is at or below the bound or a round gains nothing.
  void shed_rounds() {
    int64_t excess_before = INT64_MAX;
    std::vector<int32_t> senders;
    for (int round = 0; round < kMaxRounds; ++round) {
      if (p_.rates != nullptr) raise_bound();  // cuts added time: the mean grew
      senders.clear();
      int64_t excess = 0;
      for (int32_t s = 0; s < p_.num_servers; ++s) {
        if (ledger_.load(s) > bound_ && (pass_ != Pass::kAcrossNodes || node_excess(s) > 0)) {
          senders.push_back(s);
          excess += pass_ == Pass::kAcrossNodes ? 0 : ledger_.load(s) - bound_;
        }
      }
      if (pass_ == Pass::kAcrossNodes) {
        for (int32_t n = 0; n < p_.nodes.num_nodes(p_.num_servers); ++n) {
          excess += std::max<int64_t>(0, node_excess(n * p_.nodes.ranks_per_node));
        }
      }
      if (senders.empty() || excess >= excess_before) break;  // balanced, or no progress
      excess_before = excess;
      std::sort(senders.begin(), senders.end(), [&](int32_t a, int32_t b) {
        return ledger_.load(a) != ledger_.load(b) ? ledger_.load(a) > ledger_.load(b) : a < b;
      });
      for (int32_t src : senders) shed(src);
    }
  }

  struct Candidate {
    bool valid = false;
    size_t range = 0;
    int32_t receiver = -1;
    Shard shard;
    int64_t cost = 0;
    double bytes_per_entry = 0;
    double overhead = 0;  // time the cut adds (shard + what stays - the range before) per unit moved
  };

  int64_t room(int32_t s) const { return bound_ - ledger_.load(s); }

  // The passes over several nodes (run()): across nodes only what a node holds beyond its servers'
  // bounds, then inside each node, then anywhere (what is left). One node: kAny only.
  enum class Pass { kAny, kAcrossNodes, kInsideNode };

  // What server s's node holds beyond the bounds of its servers (< 0: the room the node has).
  int64_t node_excess(int32_t s) const {
    const int32_t first = p_.nodes.node_of(s) * p_.nodes.ranks_per_node;
    const int32_t last = std::min(p_.num_servers, first + p_.nodes.ranks_per_node);
    return node_load_[static_cast<size_t>(p_.nodes.node_of(s))] - static_cast<int64_t>(last - first) * bound_;
  }
  void sum_node_load(int32_t s) {
    const int32_t first = p_.nodes.node_of(s) * p_.nodes.ranks_per_node;
    const int32_t last = std::min(p_.num_servers, first + p_.nodes.ranks_per_node);
    int64_t sum = 0;
    for (int32_t t = first; t < last; ++t) sum += ledger_.load(t);
    node_load_[static_cast<size_t>(p_.nodes.node_of(s))] = sum;
  }
  // What a sender must shed: above its bound, and across nodes no more than its node's excess.
  int64_t need(int32_t src) const {
    const int64_t over = ledger_.load(src) - bound_;
    return pass_ == Pass::kAcrossNodes ? std::min(over, node_excess(src)) : over;
  }
  // What a receiver may take: its room, and across nodes no more than its node's room.
  int64_t take(int32_t dst) const {
    return pass_ == Pass::kAcrossNodes ? std::min(room(dst), -node_excess(dst)) : room(dst);
  }

  // The bound U = max(ceil(mean), floor(mean * (1 + tolerance))) of the current loads (raised, never
  // lowered: in time units every cut adds a little), and the receivers ordered by room under it.
  void raise_bound() {
    const int64_t sum = std::accumulate(ledger_.loads().begin(), ledger_.loads().end(), int64_t{0});
    const double mean = static_cast<double>(sum) / p_.num_servers;
    bound_ = std::max({bound_, static_cast<int64_t>(std::ceil(mean)),
                       static_cast<int64_t>(std::floor(mean * (1 + tolerance_)))});
    by_room_.clear();
    for (int32_t s = 0; s < p_.num_servers; ++s) {
      if (room(s) > 0) by_room_.insert({-room(s), s});
    }
  }
  int64_t headroom(int32_t s) const { return p_.memory_cap - ledger_.memory(s); }

  // Fewer bytes per entry first; with a rate table, moves within kSameBytes of each other prefer the
  // one adding the least time; exact ties broken by receiver, range order, then the higher shard.
  bool better(const Candidate& a, const Candidate& b) const {
    const double close = kSameBytes * std::max(a.bytes_per_entry, b.bytes_per_entry);
    if (p_.rates != nullptr && a.overhead != b.overhead && std::abs(a.bytes_per_entry - b.bytes_per_entry) <= close) {
      return a.overhead < b.overhead;
    }
    if (a.bytes_per_entry != b.bytes_per_entry) return a.bytes_per_entry < b.bytes_per_entry;
    if (a.receiver != b.receiver) return a.receiver < b.receiver;
    if (a.range != b.range) return a.range < b.range;
    return a.shard.end > b.shard.end;
  }

  // Moves shards off `src` until it is at or below the bound or nothing more can move.
  void shed(int32_t src) {
    auto& on_src = ranges_[static_cast<size_t>(src)];
    for (int64_t guard = 4 * static_cast<int64_t>(on_src.size()) + 64; need(src) > 0 && guard > 0; --guard) {
      bool memory_blocked = false;
      Candidate best = pick(src, false, memory_blocked);
      if (!best.valid && memory_blocked) best = pick(src, true, memory_blocked);  // every receiver, fitted shards
      if (best.valid) {
        apply(src, best);
        continue;
      }
      if (memory_blocked) memory_stuck_.insert(src);
      log_.debug(format("server %d keeps %lld over the bound: no shard fits%s", src,
                        static_cast<long long>(ledger_.load(src) - bound_), memory_blocked ? " (memory cap)" : ""));
      return;
    }
  }

  // The best move off `src`: among (range) x (receiver) x (shard end), the fewest bytes per score
  // entry that fits the receiver's room; else (minimum-size shards) the one that most lowers the
  // larger of the two loads; else invalid. `wide`: every server with room is a receiver and shards are
  // cut to fit its memory headroom. Sets memory_blocked if the cap refused some shard.
  Candidate pick(int32_t src, bool wide, bool& memory_blocked) {
    const auto& on_src = ranges_[static_cast<size_t>(src)];
    const int64_t need = this->need(src);
    Choice choice{Candidate{}, Candidate{}, ledger_.load(src)};
    roomiest(src, wide);
    for (size_t i = 0; i < on_src.size(); ++i) {
      const Range& r = on_src[i];
      receivers(src, r, wide);
      for (int32_t dst : receivers_) {
        // Under a cap, skip a receiver that cannot hold even the cheapest shortest shard of r.
        const int64_t shortest_end = std::min(r.end, r.begin + min_shard_);
        if (wide && !ledger_.fits_memory(dst, ledger_.delta(r.doc, r.begin, shortest_end, dst).memory)) {
          memory_blocked = true;
          continue;
        }
        cad::prefix_aware::shard_ends(p_, r, ledger_, dst, std::min(need, take(dst)), ends_);
        bool any = false;
        for (int64_t e : ends_) any |= consider(src, i, dst, e, need, wide, memory_blocked, choice);
        if (wide && !any) {  // none of those ends fits: the highest end whose shortest shard does
          const int64_t e = cad::prefix_aware::highest_end_fitting(r, ledger_, dst, headroom(dst), min_shard_);
          if (e > r.begin) consider(src, i, dst, e, need, wide, memory_blocked, choice);
        }
      }
    }
    return choice.best.valid ? choice.best : choice.fallback;
  }

  // The best move so far, and the best minimum-size shard that overflows its receiver's room.
  struct Choice {
    Candidate best, fallback;
    int64_t fallback_max;  // the larger of the two loads after the fallback move
  };

  // Scores the shard of range i ending at e for receiver dst into `choice`; true if it made a
  // candidate. A shard over the receiver's memory is skipped, or in the wide pass cut to fit.
  bool consider(int32_t src, size_t i, int32_t dst, int64_t e, int64_t need, bool wide, bool& memory_blocked,
                Choice& choice) {
    const Range& r = ranges_[static_cast<size_t>(src)][i];
    Shard sh = cad::prefix_aware::shard_ending_at(p_, r, e, need, take(dst), min_shard_);
    if (sh.begin >= sh.end) return false;
    Ledger::Delta delta = ledger_.delta(r.doc, sh.begin, sh.end, dst);
    if (!ledger_.fits_memory(dst, delta.memory) || (fair_memory_ && !wide && !fair_share(dst, delta.memory, sh, r))) {
      memory_blocked = true;
      if (!wide) return false;
      sh = cad::prefix_aware::shrink_to_memory(r, ledger_, dst, sh, headroom(dst), min_shard_);
      if (sh.begin >= sh.end) return false;
      delta = ledger_.delta(r.doc, sh.begin, sh.end, dst);
      if (!ledger_.fits_memory(dst, delta.memory)) return false;
    }
    const int64_t c = p_.cost(sh.begin, sh.end, p_.docs[static_cast<size_t>(r.doc)]);
    if (c <= 0) return false;
    const Candidate cand{true, i, dst, sh, c, delta.priced(p_.nodes) / static_cast<double>(c),
                         static_cast<double>(cut_overhead(r, sh)) / static_cast<double>(c)};
    if (c <= take(dst)) {
      if (!choice.best.valid || better(cand, choice.best)) choice.best = cand;
    } else {
      const int64_t worst = std::max(ledger_.load(src) - c, ledger_.load(dst) + c);
      if (worst < choice.fallback_max) {
        choice.fallback_max = worst;
        choice.fallback = cand;
      }
    }
    return true;
  }


  // Under a cap, the first pass lets a shard use at most the receiver's memory headroom in proportion
  // to the share of its room the shard fills, so that a few long-prefix shards with little work do not
  // exhaust a receiver's memory that later senders need (the wide pass drops this rule).
  bool fair_share(int32_t dst, int64_t memory, const Shard& sh, const Range& r) const {
    if (room(dst) <= 0) return true;
    const double c = static_cast<double>(p_.cost(sh.begin, sh.end, p_.docs[static_cast<size_t>(r.doc)]));
    const double share = std::min(1.0, c / static_cast<double>(room(dst)));
    return static_cast<double>(memory) <= share * static_cast<double>(headroom(dst));
  }

  // Receivers for range r: the few with the most room and the servers already holding part of the
  // document or its prefix; `wide` (under a cap, when those could not take a shard): every server
  // with room (fewer, chosen by free memory, balanced much worse under tight caps at 512 servers).
  // Over several nodes: inside a node only servers on src's node; across nodes only servers of other nodes
  // whose node has room. The roomiest part does not depend on the range: roomiest() makes it once per pick.
  void roomiest(int32_t src, bool wide) {
    roomiest_.clear();
    if (pass_ == Pass::kAny) {
      int n = 0;
      for (auto it = by_room_.begin(); it != by_room_.end() && (wide || n < kRoomiestReceivers); ++it) {
        if (it->second != src) {
          roomiest_.push_back(it->second);
          ++n;
        }
      }
      return;
    }
    // Inside a node: its servers by room. Across nodes: by what they may take (room capped by their node's),
    // not by room: a roomy server on a nearly full node would cut the shard into slivers, each needing its own
    // copy of the KV prefix.
    scratch_.clear();
    const bool inside = pass_ == Pass::kInsideNode;
    const int32_t first = inside ? p_.nodes.node_of(src) * p_.nodes.ranks_per_node : 0;
    const int32_t last = inside ? std::min(p_.num_servers, first + p_.nodes.ranks_per_node) : p_.num_servers;
    for (int32_t s = first; s < last; ++s) {
      if (s == src || (!inside && p_.nodes.same_node(s, src))) continue;
      const int64_t t = take(s);
      if (t > 0) scratch_.push_back({-t, s});
    }
    const size_t limit = inside ? kRoomiestReceivers : kAcrossReceivers;
    const size_t keep = wide ? scratch_.size() : std::min(scratch_.size(), limit);
    std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(keep), scratch_.end());
    for (size_t i = 0; i < keep; ++i) roomiest_.push_back(scratch_[i].second);
  }

  void receivers(int32_t src, const Range& r, bool wide) {
    receivers_ = roomiest_;
    if (wide) return;
    for (int32_t s : doc_servers_[static_cast<size_t>(r.doc)]) {
      if (s == src || room(s) <= 0) continue;
      if (pass_ == Pass::kInsideNode && !p_.nodes.same_node(s, src)) continue;
      if (pass_ == Pass::kAcrossNodes &&
          (p_.nodes.same_node(s, src) || take(s) <= 0 ||
           std::find(receivers_.begin(), receivers_.end(), s) != receivers_.end())) {
        continue;
      }
      receivers_.push_back(s);
    }
  }

  // Extra cost of cutting shard sh out of range r: what the shard and the parts left cost minus what
  // the range cost (0 for FLOPs, which add up; > 0 in time, as smaller pieces run slower).
  int64_t cut_overhead(const Range& r, const Shard& sh) const {
    if (p_.rates == nullptr) return 0;
    const auto& doc = p_.docs[static_cast<size_t>(r.doc)];
    return p_.cost(r.begin, sh.begin, doc) + p_.cost(sh.begin, sh.end, doc) + p_.cost(sh.end, r.end, doc) -
           p_.cost(r.begin, r.end, doc);
  }

  void apply(int32_t src, const Candidate& c) {
    auto& on_src = ranges_[static_cast<size_t>(src)];
    const Range r = on_src[c.range];
    by_room_.erase({-room(c.receiver), c.receiver});
    by_room_.erase({-room(src), src});
    ledger_.commit(r.doc, c.shard.begin, c.shard.end, src, c.receiver);
    ledger_.adjust_load(src, cut_overhead(r, c.shard));  // the parts left run slower than the whole (time)
    tasks_.push_back(make_task(p_.docs[static_cast<size_t>(r.doc)].id, c.shard.begin, c.shard.end, c.receiver));
    // What stays local: the part below the shard in place, the part above it appended.
    on_src[c.range].end = c.shard.begin;
    if (c.shard.end < r.end) on_src.push_back({r.doc, c.shard.end, r.end});
    if (c.shard.begin == r.begin) on_src.erase(on_src.begin() + static_cast<std::ptrdiff_t>(c.range));
    if (!node_load_.empty()) {
      sum_node_load(src);
      sum_node_load(c.receiver);
    }
    if (room(c.receiver) > 0) by_room_.insert({-room(c.receiver), c.receiver});
    if (room(src) > 0) by_room_.insert({-room(src), src});
    auto& holders = doc_servers_[static_cast<size_t>(r.doc)];
    if (std::find(holders.begin(), holders.end(), c.receiver) == holders.end()) holders.push_back(c.receiver);
  }

  const Problem& p_;
  const double tolerance_;
  int64_t bound_ = 0;
  const int64_t min_shard_;
  const bool fair_memory_;  // first pass under a cap: fair_share()
  const cad::plugin::Logger& log_;
  Ledger ledger_;
  std::vector<std::vector<Range>> ranges_;          // per server: query ranges it still computes itself
  std::vector<std::vector<int32_t>> doc_servers_;   // per document: servers holding tokens or its prefix
  std::set<std::pair<int64_t, int32_t>> by_room_;   // (-room, server) for servers below the bound
  std::set<int32_t> memory_stuck_;                  // senders the memory cap kept above the bound
  int32_t worst_stuck_ = -1;
  Pass pass_ = Pass::kAny;
  std::vector<int64_t> node_load_;                  // per node: the sum of its servers' loads (several nodes)
  std::vector<int32_t> roomiest_;                   // scratch: the roomiest receivers of this pick
  std::vector<std::pair<int64_t, int32_t>> scratch_;  // scratch: (-take, server)
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
  std::shared_ptr<const cad::plan::RateTable> rates;  // "rate_table": balance predicted time
  bool cost_memo;  // "cost_memo" (default true): memoise time-weighted costs; false only to test that
  // "min_time_gain" (time mode; default 0.015): return the time-balanced plan only if the FLOP-balanced
  // plan's predicted max/mean exceeds its by more than this fraction; 0: always the time-balanced plan.
  double min_time_gain;

  explicit PrefixAware(cad::plugin::ConfigReader& config)
      : tolerance(config.get_double("tolerance", 0.02, 0.0, 10.0)),
        min_shard_override(config.get_int("min_shard_tokens", 0, 0, int64_t{1} << 40)),
        rates(cad::balancer::read_rate_table_key(config, "rate_table")),
        cost_memo(config.get_bool("cost_memo", true)),
        min_time_gain(config.get_double("min_time_gain", 0.015, 0.0, 1.0)) {}

  void prepare(Problem& p) const { cad::balancer::use_rate_table(p, rates, cost_memo); }

  Tasks plan(const Problem& p, const cad::plugin::Logger& log) const {
    check_colocated_fits(p);
    int64_t sum = 0;
    for (const auto& doc : p.docs)
      for (const auto& span : doc.spans) sum += p.cost(span.begin, span.end, doc);
    if (sum == 0) return cad::balancer::colocated_tasks(p);
    if (p.rates == nullptr || min_time_gain == 0.0) return keep(shed(p, log), log);
    // Time mode: the time-balanced plan only where the table predicts it clearly better than the FLOP-
    // balanced one. The table's error per server is about 2% at 128K tokens per server, as large as the
    // shape effects time balancing exploits there; smaller predicted gains were measured to lose.
    Planned timed = shed(p, log);
    Problem flops = p;
    flops.rates = nullptr;
    flops.time_costs.reset();
    Planned by_flops = shed(flops, log);
    const double time_imbalance = predicted_imbalance(p, timed.tasks);
    const double flop_imbalance = predicted_imbalance(p, by_flops.tasks);
    const bool take_time = flop_imbalance > time_imbalance * (1.0 + min_time_gain);
    log.info(format("predicted time max/mean: %.4f time-balanced, %.4f FLOP-balanced; %s (min_time_gain %.4f)",
                    time_imbalance, flop_imbalance,
                    take_time ? "the time-balanced plan" : "the FLOP-balanced plan: the gain is below", min_time_gain));
    return keep(take_time ? std::move(timed) : std::move(by_flops), log);
  }

  // A plan and, when the memory cap kept a sender above the bound, the warning that says so.
  struct Planned {
    Tasks tasks;
    std::string memory_warning;
  };

  // The greedy on p: FLOPs, or predicted time when p.rates is set.
  Planned shed(const Problem& p, const cad::plugin::Logger& log) const {
    int64_t min_shard = min_shard_override > 0 ? min_shard_override : p.min_shard;
    // In time mode, no shard shorter than the table prices: with min_shard_tokens 0 (the Python runtime's
    // default) and a backward priced by tile pairs, the greedy cut slivers whose added partial pairs the
    // senders were charged with, stalled, and returned plans worse in predicted time (1.06) than FLOP
    // balancing (1.03) on Pretrain 8 x 64K batches.
    if (p.rates != nullptr) min_shard = std::max(min_shard, p.rates->shortest_priced_shard());
    Shedding plain(p, tolerance, min_shard, false, log);
    Tasks tasks = plain.run();
    if (plain.worst_stuck() < 0) return {std::move(tasks), ""};
    // The cap stopped a sender: plan again sharing each receiver's memory in proportion to its room,
    // and keep the better balanced of the two (fewer bytes when equal, as the first pass has).
    Shedding fair(p, tolerance, min_shard, true, log);
    Tasks fair_tasks = fair.run();
    if (fair.max_load() < plain.max_load()) return {std::move(fair_tasks), fair.memory_bound_warning()};
    return {std::move(tasks), plain.memory_bound_warning()};
  }

  static Tasks keep(Planned planned, const cad::plugin::Logger& log) {
    if (!planned.memory_warning.empty()) log.warn(planned.memory_warning);
    return std::move(planned.tasks);
  }

  // max/mean over servers of the table's predicted forward + backward seconds (plan_time.h), on the
  // canonical task list the caller receives (merging changes a time-weighted price).
  static double predicted_imbalance(const Problem& p, Tasks tasks) {
    cad::balancer::normalize(tasks);
    return cad::plan::imbalance_of(cad::plan::server_seconds(p.ranks, p.num_servers, tasks.data(),
                                                             static_cast<int64_t>(tasks.size()), p.model, *p.rates));
  }

  // Every plan this balancer builds keeps each owner's KV prefixes, so the colocated plan's memory is
  // a floor: if it exceeds the cap, say so instead of planning.
  static void check_colocated_fits(const Problem& p) {
    if (p.memory_cap == 0) return;
    const Ledger start(p);
    for (int32_t s = 0; s < p.num_servers; ++s) {
      if (start.memory(s) > p.memory_cap) {
        cad::plugin::fail(CAD_STATUS_UNSUPPORTED,
                          format("plan: no plan fits memory_cap_bytes = %lld: server %d already needs %lld bytes of "
                                 "KV from other ranks with every piece on its owner (documents the host split "
                                 "across ranks need their earlier tokens' KV), and prefix_aware only adds to that",
                                 static_cast<long long>(p.memory_cap), s, static_cast<long long>(start.memory(s))));
      }
    }
  }
};

}  // namespace

CAD_BALANCER_PLUGIN(PrefixAware)
