// shard_choice.cpp -- see shard_choice.h.
#include "shard_choice.h"

#include <algorithm>
#include <cmath>

namespace cad::prefix_aware {

using cad::balancer::Problem;
using cad::balancer::Range;

Shard shard_ending_at(const Problem& p, const Range& r, int64_t e, int64_t need, int64_t room, int64_t min_shard) {
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
      if (cost(mid) >= need) lo = mid;
      else hi = mid - 1;
    }
    a = lo;
    if (cost(a) > room) ++a;  // one row too many for the receiver: shed a little less
  } else {
    // The largest shard the receiver can take: the smallest a with cost(a) <= room.
    int64_t lo = b, hi = e;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (cost(mid) <= room) hi = mid;
      else lo = mid + 1;
    }
    a = lo;
  }
  if (e - a < min_shard) a = std::max(b, e - min_shard);  // shard at least the minimum
  if (a > b && a - b < min_shard) {                       // no sliver below the shard
    a = (cost(b) <= room || e - (b + min_shard) < min_shard) ? b : b + min_shard;
  }
  return {a, e};
}

void shard_ends(const Problem& p, const Range& r, const cad::balancer::Ledger& ledger, int32_t dst, int64_t target,
                std::vector<int64_t>& ends) {
  ends.clear();
  ends.push_back(r.end);
  if (!p.model.causal) return;
  const double rows_vs_kv =
      static_cast<double>(p.model.q_round_trip_bytes()) / static_cast<double>(p.model.kv_token_bytes());
  const int64_t have = ledger.kv_prefix(r.doc, dst);
  const int64_t balanced =
      std::max<int64_t>(have, std::llround(std::sqrt(static_cast<double>(target) * rows_vs_kv)));
  if (balanced > r.begin && balanced < r.end) ends.push_back(balanced);
  const auto& doc = p.docs[static_cast<size_t>(r.doc)];
  if (p.cost(r.begin, r.end, doc) > target) {
    int64_t lo = r.begin + 1, hi = r.end;  // the smallest e with cost(begin, e) >= target
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (p.cost(r.begin, mid, doc) >= target) hi = mid;
      else lo = mid + 1;
    }
    if (lo < r.end) ends.push_back(lo);
  }
}

int64_t highest_end_fitting(const Range& r, const cad::balancer::Ledger& ledger, int32_t dst,
                            int64_t headroom, int64_t min_shard) {
  const int64_t shortest = std::min(min_shard, r.end - r.begin);
  auto fits = [&](int64_t e) { return ledger.delta(r.doc, e - shortest, e, dst).memory <= headroom; };
  // The KV prefix grows with e, so the memory of a fixed-size shard does too: binary search.
  int64_t lo = r.begin + shortest, hi = r.end;
  if (!fits(lo)) return r.begin;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

Shard shrink_to_memory(const Range& r, const cad::balancer::Ledger& ledger, int32_t dst, Shard sh,
                       int64_t headroom, int64_t min_shard) {
  const int64_t e = sh.end;
  const int64_t shortest = std::min(min_shard, e - r.begin);
  auto fits = [&](int64_t a) { return ledger.delta(r.doc, a, e, dst).memory <= headroom; };
  int64_t lo = sh.begin, hi = e - shortest;  // the smallest start in [lo, hi] that fits (memory falls as a rises)
  if (hi < lo || !fits(hi)) return {};
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  int64_t a = lo;
  if (a > r.begin && a - r.begin < min_shard) a = r.begin + min_shard;  // no sliver below the shard
  if (e - a < shortest) return {};
  return {a, e};
}

}  // namespace cad::prefix_aware
