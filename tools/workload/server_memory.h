// server_memory.h -- what each attention server of a plan must hold, per document: the K/V rows of its
// one copy of each document's prefix (plan_model.h's KV rule: the hull of its tasks' key ranges), the part
// of them and of the query rows that other ranks send it, and the least any plan needs for a document (the
// server of its last query holds every key that query reads). A document longer than a rank makes these
// large: the last piece of a 1M-token document needs the whole document's K/V on its server. Used by
// `cad plan` to report memory per server and to refuse a layout or a plan that cannot fit a memory cap,
// naming the document, the rank and the bytes, before any step runs out of memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cad_balancer_v1.h"
#include "plan_model.h"

namespace cad::workload {

// One (server, document) pair of a plan.
struct DocMemory {
  int64_t doc_id = -1;
  int64_t kv_rows = 0;          // K/V rows the server holds of the document (its own and received)
  int64_t foreign_kv_rows = 0;  // of those, rows other ranks send
  int64_t foreign_q_rows = 0;   // query rows other ranks send (their Q in, O out)
  int64_t foreign_bytes = 0;    // foreign_kv_rows * kv_token_bytes + foreign_q_rows * q_memory_bytes
};

struct ServerMemory {
  std::vector<int64_t> kv_rows;        // per server: K/V rows held, one copy per document
  std::vector<int64_t> kv_bytes;       // kv_rows * kv_token_bytes
  std::vector<int64_t> foreign_bytes;  // Q/K/V/O bytes received: PlanStats::memory_received, what a cap bounds
  std::vector<DocMemory> largest;      // per server: the document with the most foreign bytes there
};

// The memory of a plan's tasks over the piece tables. Throws std::invalid_argument for a task whose server
// is outside [0, num_servers) or whose document no rank holds.
ServerMemory server_memory(const cad::plan::RankPieces& ranks, int32_t num_servers, const cad_task_v1_t* tasks,
                           int64_t num_tasks, const cad::plan::ModelParams& params);

// The least foreign memory any plan needs for one document: the server of its last query receives every key
// that query reads and the query itself, less what it holds. `rank` is the rank that would receive least.
struct MemoryFloor {
  int64_t doc_id = -1;
  int64_t doc_len = 0;
  cad::plan::KvRange keys;  // the keys the last query reads
  int32_t rank = -1;
  int64_t held = 0;         // of those keys, the tokens `rank` holds
  int64_t bytes = 0;        // what `rank` would receive
};
// The document of the layout whose floor is largest (doc_id -1 when there are no pieces).
MemoryFloor largest_memory_floor(const cad::plan::RankPieces& ranks, const cad::plan::ModelParams& params);

// Empty when `floor` fits `cap_bytes` (0 = no cap); else why no plan of the layout fits, naming the
// document, the rank and the bytes.
std::string layout_refusal(const MemoryFloor& floor, int64_t cap_bytes);
// Empty when every server of `memory` fits `cap_bytes` (0 = no cap); else the first server over it, its
// bytes and its largest document.
std::string plan_refusal(const ServerMemory& memory, int64_t cap_bytes);

}  // namespace cad::workload
