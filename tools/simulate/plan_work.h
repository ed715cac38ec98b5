// plan_work.h -- from a batch and a balancer's plan to what each data-parallel rank does per layer:
//  - group_pieces: the ranks of one balancing group, as they would be planned on their own (a document
//    cut by the group's edge becomes its own, shorter document: outside CAD's group nobody ships its
//    earlier tokens' K/V; plain data parallelism treats a cut document the same way);
//  - context_parallel_layout: the token layout that per-document context parallelism trains on (every
//    rank holds its own chunks of every document, so only K/V moves), taken from the plan itself;
//  - rank_work: tokens, shards served and all_to_all_v bytes per rank, from plan_model's link matrix.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_rates.h"
#include "cad_balancer_v1.h"
#include "layout.h"
#include "plan_model.h"
#include "step_model.h"

namespace cad::simulate {

cad::plan::RankPieces documents_per_rank(const cad::plan::RankPieces& batch);

// Long documents (`cad simulate --max-doc-len`): the batch laid whole over the ranks (long_docs.h, the
// layout of cad.pack_documents), then cut only where a group of `unit` ranks ends ([g*unit, (g+1)*unit)):
// a document crossing such an edge goes on as a new document in the next group (as group_pieces makes
// it), so that every balancer, whatever its groups (multiples of `unit`), computes the same attention.
// Pieces of one document inside a group keep one id, its doc_len and their offsets. Ids are renumbered
// 0, 1, ... in rank order. `cut_documents` (may be null) receives how many documents an edge cut.
cad::plan::RankPieces documents_within_groups(const cad::plan::RankPieces& batch, int64_t unit,
                                              int64_t* cut_documents);

cad::plan::RankPieces group_pieces(const cad::plan::RankPieces& all, int64_t begin, int64_t end);

// Rank s holds exactly the query ranges of the tasks on server s. `pieces` gives the documents' lengths.
cad::plan::RankPieces context_parallel_layout(const cad::plan::RankPieces& pieces,
                                              const std::vector<cad_task_v1_t>& tasks, int32_t servers);

// Layout::rail_routed (layout.h, `--nic-share node`): rebuilds the group's ranks' bytes from the link matrix
// ([src * stride + dst], the group's ranks from first_rank): each rank's sent_inter becomes what its NIC carries
// (what its node sends to its rail's ranks in other nodes), and a byte sent to another rail adds to the sender's
// sent_intra and the relaying rank's received_intra (the NVLink hop). received_inter is left as it is (a byte
// arrives at its destination's NIC either way). rank_work calls it when the layout says so.
void route_by_rail(const std::vector<int64_t>& link_bytes, size_t stride, const Layout& layout, int64_t first_rank,
                   std::vector<RankWork>& work);

// Per rank of the group (ranks [first_rank, first_rank + pieces.size()) of the layout): tokens held,
// attention seconds of the shards it serves, bytes to and from peers inside / outside its node.
// Also returns the plan's total forward bytes in `total_bytes`.
std::vector<RankWork> rank_work(const cad::plan::RankPieces& pieces, const std::vector<cad_task_v1_t>& tasks,
                                const cad::plan::ModelParams& params, const Layout& layout, int64_t first_rank,
                                const AttentionRates& rates, double* total_bytes);

}  // namespace cad::simulate
