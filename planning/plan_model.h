// plan_model.h -- the one cost and traffic model of a plan, shared by the balancers (to decide), CAD's
// runtime stats and `cad plan` (to report). Plain functions over plain structs: no plugin state, no
// logging, no exceptions except std::invalid_argument for a task that names an unknown document.
//
// Cost: a causal task with q = q_end - q_begin queries and kv = q_end keys computes
// q*kv - q*(q-1)/2 score entries; a non-causal one q*doc_len. FLOPs = 4 * head_dim * Hq * entries.
// With a sliding window (left, right) (cad_attention_v1.h; -1 = no limit) a query at document position p
// sees keys [max(0, p - left), min(doc_len - 1, p + right)] (right = 0 when causal): a causal one costs
// min(p + 1, left + 1) entries.
//
// Forward-pass traffic of a task on server s (rank r holds its own pieces and is also server r):
//  - Q rows of the task that s does not hold travel owner -> s; their O rows and fp32 LSE travel back.
//  - K/V: s needs the document's prefix [0, max q_end of its tasks of that document) (causal) or the
//    whole document (non-causal), ONCE per (server, document) however many tasks share it, minus the
//    tokens s already holds; each missing token travels owner -> s. With a window a task needs only
//    task_kv_range(); s holds one copy of the hull of its tasks' ranges of the document.
#pragma once

#include <cstdint>
#include <vector>

#include "cad_balancer_v1.h"

namespace cad::plan {

// Piece tables of all ranks: ranks[r] is rank r's pieces, in its token order.
using RankPieces = std::vector<std::vector<cad_piece_v1_t>>;

struct ModelParams {
  int32_t num_q_heads = 32;
  int32_t num_kv_heads = 8;
  int32_t head_dim = 128;
  int32_t bytes_per_element = 2;
  bool causal = true;
  int64_t window_left = -1;   // sliding window; -1 = no limit. Causal: window_right is kept at -1
  int64_t window_right = -1;

  bool windowed() const { return window_left >= 0 || window_right >= 0; }
  int64_t q_row_bytes() const { return int64_t{num_q_heads} * head_dim * bytes_per_element; }
  int64_t o_row_bytes() const { return q_row_bytes(); }
  int64_t lse_row_bytes() const { return int64_t{num_q_heads} * 4; }  // LSE is fp32
  int64_t kv_token_bytes() const { return 2 * int64_t{num_kv_heads} * head_dim * bytes_per_element; }
  // What a query row costs to ship out and back (Q there, O and LSE back).
  int64_t q_round_trip_bytes() const { return q_row_bytes() + o_row_bytes() + lse_row_bytes(); }
  // What a foreign query row / KV token occupies on the receiving server (Q/K/V/O, the memory cap).
  int64_t q_memory_bytes() const { return q_row_bytes() + o_row_bytes(); }
};

ModelParams model_params(const cad_cost_params_v1_t& cost);

// Score entries of queries [q_begin, q_end) of a document of length doc_len.
int64_t task_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, bool causal);
// The same under the params' mask (causal and window).
int64_t task_cost(int64_t q_begin, int64_t q_end, int64_t doc_len, const ModelParams& params);

// Keys [begin, end) of a document that queries [q_begin, q_end) read under the params' mask; {0, 0}
// when the task is empty. Without a window: [0, task_kv_end(...)).
struct KvRange {
  int64_t begin = 0;
  int64_t end = 0;
  bool empty() const { return end <= begin; }
  // The smallest range holding both (what one copy per server and document must cover).
  KvRange hull(const KvRange& o) const {
    if (empty()) return o;
    if (o.empty()) return *this;
    return {begin < o.begin ? begin : o.begin, end > o.end ? end : o.end};
  }
};
KvRange task_kv_range(int64_t q_begin, int64_t q_end, int64_t doc_len, const ModelParams& params);
// THE KV-prefix rule (the only copy: the cost model below and CAD's dispatch layout both call it). A server
// holds ONE copy of a document's keys/values for all of its tasks of that document: the prefix
// [0, max over those tasks of task_kv_end). A task reads [0, q_end) causal, the whole document otherwise;
// an empty task reads nothing.
inline int64_t task_kv_end(int64_t q_begin, int64_t q_end, int64_t doc_len, bool causal) {
  if (q_end <= q_begin) return 0;
  return causal ? q_end : doc_len;
}

// Forward FLOPs of `entries` score entries.
double entries_to_flops(int64_t entries, const ModelParams& params);

struct PlanStats {
  int32_t num_servers = 0;
  int32_t num_ranks = 0;
  int32_t num_nodes = 0;                 // max(num_ranks, num_servers): the size of the link matrix
  std::vector<int64_t> cost;             // score entries per server
  std::vector<double> flops;             // forward FLOPs per server
  std::vector<int64_t> bytes_sent;       // per node (rank/server), forward pass, both directions
  std::vector<int64_t> bytes_received;   // per node
  std::vector<int64_t> memory_received;  // per server: foreign Q/K/V/O bytes it holds (memory cap)
  std::vector<int64_t> link_bytes;       // [src * num_nodes + dst]
  int64_t total_bytes = 0;               // sum over links
  int64_t q_rows_moved = 0;              // query rows computed away from their owner
  int64_t kv_tokens_moved = 0;           // KV tokens shipped (each once per server and document)
  int64_t total_cost = 0;
  double max_cost = 0, mean_cost = 0;
  double imbalance = 1.0;                // max / mean server cost (1 when there is no work)
};

// Evaluate a plan's tasks against the piece tables. Tasks may come in any order. Throws
// std::invalid_argument if a task names a document no rank holds.
PlanStats evaluate_plan(const RankPieces& ranks, int32_t num_servers, const cad_task_v1_t* tasks,
                        int64_t num_tasks, const ModelParams& params);

// The colocated baseline (every piece computed by its owner): cost per rank, no traffic.
std::vector<int64_t> colocated_cost(const RankPieces& ranks, bool causal);
std::vector<int64_t> colocated_cost(const RankPieces& ranks, const ModelParams& params);  // with its window

// max / mean of a cost vector (1 when all are 0).
double imbalance_of(const std::vector<int64_t>& cost);

}  // namespace cad::plan
