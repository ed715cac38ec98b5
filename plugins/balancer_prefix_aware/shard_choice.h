// shard_choice.h -- where prefix_aware cuts a shard out of a range a sender still computes: pure
// functions of the problem, the range, the amount wanted and what the receiver already holds.
#pragma once

#include <cstdint>
#include <vector>

#include "balancer_support.h"

namespace cad::prefix_aware {

// Queries [begin, end) of a range's document; invalid when begin >= end.
struct Shard {
  int64_t begin = 0;
  int64_t end = 0;
};

// The shard of range r that ends at `e` (adjusted, see below) and moves about min(need, room) score
// entries: `need` is what the sender must shed, `room` what the receiver can take. The start is found
// by binary search on the exact cost: the smallest shard that sheds `need` if the receiver can take it,
// else the largest the receiver can take. Shards and the pieces they leave on either side are at least
// `min_shard` tokens unless the range itself is shorter, so a shard may cost more than `room`.
Shard shard_ending_at(const cad::balancer::Problem& p, const cad::balancer::Range& r, int64_t e, int64_t need,
                      int64_t room, int64_t min_shard);

// Where a shard of r for receiver `dst` may best end: the range's top (most work per query row); the
// end that balances query-row bytes against KV-prefix bytes (rows ~ target/e, prefix ~ e beyond what
// dst already has, so e ~ sqrt(target * row bytes / KV bytes)); and the lowest end that still carries
// the whole target. Non-causal: only the top (every shard needs the whole document).
void shard_ends(const cad::balancer::Problem& p, const cad::balancer::Range& r, const cad::balancer::Ledger& ledger,
                int32_t dst, int64_t target, std::vector<int64_t>& ends);

// Under a memory cap: the highest end e of range r such that a shortest shard ending there (min_shard
// rows, or the whole range) fits the `headroom` bytes dst has left (a lower end needs a shorter KV
// prefix). r.begin when none fits.
int64_t highest_end_fitting(const cad::balancer::Range& r, const cad::balancer::Ledger& ledger, int32_t dst,
                            int64_t headroom, int64_t min_shard);

// Shard sh of range r with its start raised (fewer rows, less Q/O memory) until it fits dst's memory
// cap; it keeps its end and the minimum sizes of shard_ending_at. Invalid (begin >= end) if nothing fits.
Shard shrink_to_memory(const cad::balancer::Range& r, const cad::balancer::Ledger& ledger, int32_t dst, Shard sh,
                       int64_t headroom, int64_t min_shard);

}  // namespace cad::prefix_aware
