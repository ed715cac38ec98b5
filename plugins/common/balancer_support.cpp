// balancer_support.cpp -- see balancer_support.h.
#include "balancer_support.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "plan_limits.h"
#include "window.h"

namespace cad::balancer {

using plugin::fail;
using plugin::format;

namespace {

long long ll(int64_t v) { return static_cast<long long>(v); }

void check_cost_params(const cad_cost_params_v1_t* cost) {
  if (cost == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "plan: input->cost is NULL");
  if (cost->struct_size < CAD_COST_PARAMS_V1_1_SIZE) {  // the v1.2 window is read only when present
    fail(CAD_STATUS_ABI_MISMATCH, format("plan: cost->struct_size is %zu, expected at least %zu", cost->struct_size,
                                         static_cast<size_t>(CAD_COST_PARAMS_V1_1_SIZE)));
  }
  auto positive = [](const char* name, int64_t v) {
    if (v < 1) fail(CAD_STATUS_INVALID_ARGUMENT, format("plan: cost->%s = %lld, expected >= 1", name, ll(v)));
  };
  positive("num_q_heads", cost->num_q_heads);
  positive("num_kv_heads", cost->num_kv_heads);
  positive("head_dim", cost->head_dim);
  positive("bytes_per_element", cost->bytes_per_element);
  if (cost->num_q_heads % cost->num_kv_heads != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("plan: cost->num_q_heads = %d is not a multiple of num_kv_heads = %d",
                                             cost->num_q_heads, cost->num_kv_heads));
  }
  if (cost->causal != 0 && cost->causal != 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("plan: cost->causal = %d, expected 0 or 1", cost->causal));
  }
  if (cost->reserved != 0) fail(CAD_STATUS_INVALID_ARGUMENT, "plan: cost->reserved must be 0");
  if (cad::plugin::window_given(cost, "plan: cost")) {
    cad::plugin::check_window(cost->window_left, cost->window_right, cost->causal == 1, "plan: cost");
  }
  if (cost->min_shard_tokens < 0 || cost->memory_cap_bytes < 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("plan: cost->min_shard_tokens = %lld and memory_cap_bytes = %lld, "
                                             "expected both >= 0", ll(cost->min_shard_tokens),
                                             ll(cost->memory_cap_bytes)));
  }
}

// One piece with where it came from, for the tiling check.
struct Located {
  cad_piece_v1_t piece;
  int32_t rank;
  int64_t index;
};

std::string where(const Located& p) {
  return format("rank %d piece %lld (document %lld, tokens [%lld, %lld))", p.rank, ll(p.index), ll(p.piece.doc_id),
                ll(p.piece.offset_in_doc), ll(p.piece.offset_in_doc + p.piece.len));
}

void check_piece(const Located& p) {
  const cad_piece_v1_t& x = p.piece;
  const std::string at = format("plan: rank %d piece %lld (document %lld)", p.rank, ll(p.index), ll(x.doc_id));
  if (x.len < 1) fail(CAD_STATUS_INVALID_ARGUMENT, at + format(": len = %lld, expected >= 1", ll(x.len)));
  if (x.doc_len < 1) fail(CAD_STATUS_INVALID_ARGUMENT, at + format(": doc_len = %lld, expected >= 1", ll(x.doc_len)));
  if (x.offset_in_doc < 0 || x.offset_in_doc > x.doc_len - x.len) {  // len, doc_len >= 1: no overflow
    fail(CAD_STATUS_INVALID_ARGUMENT, at + format(": offset_in_doc = %lld, len = %lld lie outside the document "
                                                  "[0, %lld)", ll(x.offset_in_doc), ll(x.len), ll(x.doc_len)));
  }
}

// Groups the pieces by document and checks that each document's pieces tile [0, doc_len) once.
std::vector<Doc> build_docs(std::vector<Located>& all) {
  std::sort(all.begin(), all.end(), [](const Located& a, const Located& b) {
    if (a.piece.doc_id != b.piece.doc_id) return a.piece.doc_id < b.piece.doc_id;
    if (a.piece.offset_in_doc != b.piece.offset_in_doc) return a.piece.offset_in_doc < b.piece.offset_in_doc;
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.index < b.index;
  });
  std::vector<Doc> docs;
  for (size_t i = 0; i < all.size();) {
    const Located& first = all[i];
    Doc doc{first.piece.doc_id, first.piece.doc_len, {}};
    int64_t covered = 0;
    size_t j = i;
    for (; j < all.size() && all[j].piece.doc_id == doc.id; ++j) {
      const Located& p = all[j];
      if (p.piece.doc_len != doc.len) {
        fail(CAD_STATUS_INVALID_ARGUMENT,
             format("plan: %s says doc_len = %lld, but rank %d piece %lld says %lld", where(p).c_str(),
                    ll(p.piece.doc_len), first.rank, ll(first.index), ll(doc.len)));
      }
      if (p.piece.offset_in_doc > covered) {
        fail(CAD_STATUS_INVALID_ARGUMENT,
             format("plan: tokens [%lld, %lld) of document %lld are held by no rank (the next piece is %s)",
                    ll(covered), ll(p.piece.offset_in_doc), ll(doc.id), where(p).c_str()));
      }
      if (p.piece.offset_in_doc < covered) {
        const Located& prev = all[j - 1];
        fail(CAD_STATUS_INVALID_ARGUMENT,
             format("plan: %s overlaps %s", where(p).c_str(), where(prev).c_str()));
      }
      doc.spans.push_back({p.piece.offset_in_doc, p.piece.offset_in_doc + p.piece.len, p.rank});
      covered = p.piece.offset_in_doc + p.piece.len;
    }
    if (covered != doc.len) {
      fail(CAD_STATUS_INVALID_ARGUMENT,
           format("plan: tokens [%lld, %lld) of document %lld are held by no rank (its last piece is %s)",
                  ll(covered), ll(doc.len), ll(doc.id), where(all[j - 1]).c_str()));
    }
    docs.push_back(std::move(doc));
    i = j;
  }
  return docs;
}

size_t doc_index(const std::vector<Doc>& docs, int64_t doc_id) {
  auto it = std::lower_bound(docs.begin(), docs.end(), doc_id, [](const Doc& d, int64_t id) { return d.id < id; });
  if (it == docs.end() || it->id != doc_id) {
    fail(CAD_STATUS_INTERNAL, format("plan names document %lld, which no rank holds", ll(doc_id)));
  }
  return static_cast<size_t>(it - docs.begin());
}

}  // namespace

Problem read_input(const cad_balance_input_v1_t* input) {
  if (input == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "plan: input is NULL");
  if (input->struct_size < sizeof(cad_balance_input_v1_t)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("plan: input->struct_size is %zu, expected at least %zu", input->struct_size,
                                         sizeof(cad_balance_input_v1_t)));
  }
  if (input->num_ranks < 0) fail(CAD_STATUS_INVALID_ARGUMENT, format("plan: num_ranks = %d, expected >= 0", input->num_ranks));
  if (input->num_servers < 1) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("plan: num_servers = %d, expected >= 1", input->num_servers));
  }
  if (input->num_servers < input->num_ranks) {
    fail(CAD_STATUS_UNSUPPORTED, format("plan: num_servers = %d is less than num_ranks = %d (every rank is also a "
                                        "server in CAD)", input->num_servers, input->num_ranks));
  }
  if (input->num_ranks > 0 && input->ranks == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "plan: input->ranks is NULL");
  check_cost_params(input->cost);

  Problem problem;
  problem.num_ranks = input->num_ranks;
  problem.num_servers = input->num_servers;
  problem.model = plan::model_params(*input->cost);
  problem.min_shard = std::max<int64_t>(1, input->cost->min_shard_tokens);
  problem.memory_cap = input->cost->memory_cap_bytes;
  problem.ranks.resize(static_cast<size_t>(input->num_ranks));

  std::vector<Located> all;
  for (int32_t r = 0; r < input->num_ranks; ++r) {
    const cad_rank_pieces_v1_t& rank = input->ranks[r];
    if (rank.num_pieces < 0 || (rank.num_pieces > 0 && rank.pieces == nullptr)) {
      fail(CAD_STATUS_INVALID_ARGUMENT, format("plan: rank %d: num_pieces = %lld with pieces %s", r,
                                               ll(rank.num_pieces), rank.pieces ? "set" : "NULL"));
    }
    problem.ranks[static_cast<size_t>(r)].assign(rank.pieces, rank.pieces + rank.num_pieces);
    for (int64_t i = 0; i < rank.num_pieces; ++i) {
      all.push_back({rank.pieces[i], r, i});
      check_piece(all.back());
    }
  }
  problem.docs = build_docs(all);
  const std::string overflow = plan::model_overflow(problem.ranks, problem.num_servers, problem.model);
  if (!overflow.empty()) fail(CAD_STATUS_UNSUPPORTED, "plan: " + overflow);
  return problem;
}

Tasks colocated_tasks(const Problem& problem) {
  Tasks tasks;
  for (int32_t r = 0; r < problem.num_ranks; ++r) {
    for (const auto& p : problem.ranks[static_cast<size_t>(r)]) {
      tasks.push_back(make_task(p.doc_id, p.offset_in_doc, p.offset_in_doc + p.len, r));
    }
  }
  return tasks;
}

std::vector<std::vector<Range>> colocated_ranges(const Problem& problem) {
  std::vector<std::vector<Range>> ranges(static_cast<size_t>(problem.num_servers));
  for (int32_t d = 0; d < static_cast<int32_t>(problem.docs.size()); ++d) {
    for (const Span& s : problem.docs[static_cast<size_t>(d)].spans) {
      ranges[static_cast<size_t>(s.rank)].push_back({d, s.begin, s.end});
    }
  }
  return ranges;
}

std::shared_ptr<const plan::RateTable> read_rate_table_key(plugin::ConfigReader& config, const std::string& key) {
  const std::string path = config.get_string(key, "");
  if (path.empty()) return nullptr;
  try {
    return std::make_shared<const plan::RateTable>(plan::load_rate_table(path));
  } catch (const std::invalid_argument& e) {
    fail(CAD_STATUS_INVALID_ARGUMENT, "config key '" + key + "': " + e.what());
  }
}

void use_rate_table(Problem& problem, const std::shared_ptr<const plan::RateTable>& table, bool memo) {
  if (table == nullptr) return;
  if (table->head_dim != problem.model.head_dim) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("plan: the rate table %s holds rates measured at head_dim %d, but cost->head_dim = %d",
                table->path.c_str(), table->head_dim, problem.model.head_dim));
  }
  if (problem.model.windowed()) {
    // The table's rates are measured per (q, kv) shape without a window; pricing a windowed task by
    // them would be a guess presented as a prediction.
    fail(CAD_STATUS_UNSUPPORTED, format("plan: the rate table %s has no rates for sliding windows (window_left = "
                                        "%lld, window_right = %lld); plan windowed batches without a rate table",
                                        table->path.c_str(), ll(problem.model.window_left),
                                        ll(problem.model.window_right)));
  }
  problem.rates = table.get();
  if (memo) problem.time_costs = std::make_shared<plan::TimeCostMemo>(*table, problem.model.causal);
}

// ---- Ledger -------------------------------------------------------------------------------------

Ledger::Ledger(const Problem& problem)
    : problem_(problem),
      load_(static_cast<size_t>(problem.num_servers), 0),
      memory_(static_cast<size_t>(problem.num_servers), 0) {
  for (int32_t d = 0; d < static_cast<int32_t>(problem.docs.size()); ++d) {
    const Doc& doc = problem.docs[static_cast<size_t>(d)];
    for (const Span& s : doc.spans) {
      load_[static_cast<size_t>(s.rank)] += problem.cost(s.begin, s.end, doc);
      plan::KvRange& have = kv_[key(d, s.rank)];
      have = have.hull(kv_needed(d, s.begin, s.end));
    }
  }
  // A rank holding a later piece of a host-split document already needs the earlier tokens' KV.
  for (const auto& [k, range] : kv_) {  // a sum per server: the visiting order does not matter
    const auto d = static_cast<int32_t>(k >> 32);
    const auto server = static_cast<int32_t>(k & 0xffffffffu);
    memory_[static_cast<size_t>(server)] +=
        foreign_tokens(problem.docs[static_cast<size_t>(d)], range.begin, range.end, server) *
        problem.model.kv_token_bytes();
  }
}

plan::KvRange Ledger::kv_needed(int32_t doc, int64_t q_begin, int64_t q_end) const {
  return plan::task_kv_range(q_begin, q_end, problem_.docs[static_cast<size_t>(doc)].len, problem_.model);
}

Ledger::Foreign Ledger::foreign(const Doc& doc, int64_t begin, int64_t end, int32_t server) const {
  Foreign n;
  for (const Span& s : doc.spans) {
    if (s.rank == server) continue;
    const int64_t overlap = std::max<int64_t>(0, std::min(end, s.end) - std::max(begin, s.begin));
    n.tokens += overlap;
    if (!problem_.nodes.same_node(s.rank, server)) n.inter += overlap;
  }
  return n;
}

Ledger::Delta Ledger::delta(int32_t doc, int64_t q_begin, int64_t q_end, int32_t server) const {
  const Doc& d = problem_.docs[static_cast<size_t>(doc)];
  const ModelParams& m = problem_.model;
  Delta out;
  const Foreign rows = foreign(d, q_begin, q_end, server);
  out.bytes += rows.tokens * m.q_round_trip_bytes();
  out.inter_bytes += rows.inter * m.q_round_trip_bytes();
  out.memory += rows.tokens * m.q_memory_bytes();
  auto it = kv_.find(key(doc, server));
  const plan::KvRange have = it == kv_.end() ? plan::KvRange{} : it->second;
  const plan::KvRange after = have.hull(kv_needed(doc, q_begin, q_end));
  // The tokens the hull gains on either side of what is there (one copy per server and document).
  Foreign tokens;
  if (have.empty()) {
    tokens = foreign(d, after.begin, after.end, server);
  } else {
    const Foreign below = foreign(d, after.begin, have.begin, server);
    const Foreign above = foreign(d, have.end, after.end, server);
    tokens = {below.tokens + above.tokens, below.inter + above.inter};
  }
  out.bytes += tokens.tokens * m.kv_token_bytes();
  out.inter_bytes += tokens.inter * m.kv_token_bytes();
  out.memory += tokens.tokens * m.kv_token_bytes();
  return out;
}

void Ledger::commit(int32_t doc, int64_t q_begin, int64_t q_end, int32_t from, int32_t to) {
  const Delta d = delta(doc, q_begin, q_end, to);
  const int64_t c = problem_.cost(q_begin, q_end, problem_.docs[static_cast<size_t>(doc)]);
  load_[static_cast<size_t>(from)] -= c;
  load_[static_cast<size_t>(to)] += c;
  memory_[static_cast<size_t>(to)] += d.memory;
  plan::KvRange& have = kv_[key(doc, to)];
  have = have.hull(kv_needed(doc, q_begin, q_end));
}

// ---- canonical form and checks --------------------------------------------------------------------

void normalize(Tasks& tasks) {
  std::sort(tasks.begin(), tasks.end(), [](const cad_task_v1_t& a, const cad_task_v1_t& b) {
    if (a.server != b.server) return a.server < b.server;
    if (a.doc_id != b.doc_id) return a.doc_id < b.doc_id;
    return a.q_begin < b.q_begin;
  });
  Tasks merged;
  merged.reserve(tasks.size());
  for (const auto& t : tasks) {
    if (!merged.empty() && merged.back().server == t.server && merged.back().doc_id == t.doc_id &&
        merged.back().q_end == t.q_begin) {
      merged.back().q_end = t.q_end;
    } else {
      merged.push_back(t);
    }
  }
  tasks.swap(merged);
}

void check_partition(const Problem& problem, const Tasks& tasks) {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> ranges(problem.docs.size());
  for (const auto& t : tasks) {
    if (t.server < 0 || t.server >= problem.num_servers || t.q_begin >= t.q_end || t.reserved != 0) {
      fail(CAD_STATUS_INTERNAL, format("balancer produced a bad task (document %lld, [%lld, %lld), server %d)",
                                       ll(t.doc_id), ll(t.q_begin), ll(t.q_end), t.server));
    }
    ranges[doc_index(problem.docs, t.doc_id)].push_back({t.q_begin, t.q_end});
  }
  for (size_t d = 0; d < ranges.size(); ++d) {
    auto& r = ranges[d];
    std::sort(r.begin(), r.end());
    int64_t covered = 0;
    for (const auto& [b, e] : r) {
      if (b != covered) break;
      covered = e;
    }
    if (covered != problem.docs[d].len) {
      fail(CAD_STATUS_INTERNAL, format("balancer's tasks do not partition document %lld (length %lld) exactly once",
                                       ll(problem.docs[d].id), ll(problem.docs[d].len)));
    }
  }
}

void check_memory_cap(const Problem& problem, const Tasks& tasks) {
  if (problem.memory_cap == 0) return;
  const plan::PlanStats st = plan::evaluate_plan(problem.ranks, problem.num_servers, tasks.data(),
                                                 static_cast<int64_t>(tasks.size()), problem.model);
  for (int32_t s = 0; s < problem.num_servers; ++s) {
    const int64_t got = st.memory_received[static_cast<size_t>(s)];
    if (got > problem.memory_cap) {
      fail(CAD_STATUS_UNSUPPORTED,
           format("plan: server %d would receive %lld bytes of Q/K/V/O, more than memory_cap_bytes = %lld", s,
                  ll(got), ll(problem.memory_cap)));
    }
  }
}

void log_node_bytes(const Problem& problem, const Tasks& tasks, const plugin::Logger& log) {
  if (!problem.nodes.multi_node(problem.num_servers) || !log.enabled(CAD_LOG_DEBUG)) return;
  const plan::PlanStats st = plan::evaluate_plan(problem.ranks, problem.num_servers, tasks.data(),
                                                 static_cast<int64_t>(tasks.size()), problem.model);
  const plan::NodeBytes split = plan::split_by_node(st, problem.nodes);
  log.debug(format("plan over %d nodes of %d ranks: %lld bytes inside nodes, %lld bytes across nodes",
                   problem.nodes.num_nodes(problem.num_servers), problem.nodes.ranks_per_node,
                   ll(split.intra_total), ll(split.inter_total)));
}

// ---- plan allocation -----------------------------------------------------------------------------

cad_plan_v1_t* allocate_plan(int32_t num_servers, const Tasks& tasks) {
  static_assert(sizeof(cad_plan_v1_t) % alignof(cad_task_v1_t) == 0, "tasks follow the header");
  void* block = ::operator new(sizeof(cad_plan_v1_t) + tasks.size() * sizeof(cad_task_v1_t));
  auto* task_array = reinterpret_cast<cad_task_v1_t*>(static_cast<char*>(block) + sizeof(cad_plan_v1_t));
  if (!tasks.empty()) std::memcpy(task_array, tasks.data(), tasks.size() * sizeof(cad_task_v1_t));
  auto* plan = new (block) cad_plan_v1_t{sizeof(cad_plan_v1_t), CAD_PLAN_FORMAT_VERSION, num_servers, task_array,
                                         static_cast<int64_t>(tasks.size())};
  return plan;
}

void free_plan(cad_plan_v1_t* plan) {
  if (plan != nullptr) ::operator delete(static_cast<void*>(plan));
}

}  // namespace cad::balancer
