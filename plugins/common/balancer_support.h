// balancer_support.h -- what the four balancer plugins share: reading and validating the ABI input,
// the colocated starting point, a ledger of load/traffic/memory for algorithms that move work,
// putting a plan into its canonical form and checking it, plan allocation, and the ABI glue. Each
// balancer folder then holds only its algorithm and a one-line plugin table (CAD_BALANCER_PLUGIN).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "balancer_topology.h"
#include "node_map.h"
#include "plan_model.h"
#include "plan_time.h"
#include "plugin_support.h"

namespace cad::balancer {

using plan::ModelParams;
using plan::RankPieces;
using Tasks = std::vector<cad_task_v1_t>;

// Tokens [begin, end) of a document, held by `rank`.
struct Span {
  int64_t begin;
  int64_t end;
  int32_t rank;
};

// One document: its spans sorted by begin, tiling [0, len) exactly once (validated).
struct Doc {
  int64_t id;
  int64_t len;
  std::vector<Span> spans;
};

// The validated input of one plan call, as plain data.
struct Problem {
  int32_t num_ranks = 0;
  int32_t num_servers = 0;  // >= num_ranks; servers beyond num_ranks hold no tokens
  ModelParams model;
  int64_t min_shard = 1;   // the cost params' min_shard_tokens, at least 1
  int64_t memory_cap = 0;  // 0 = no cap
  RankPieces ranks;
  std::vector<Doc> docs;   // sorted by id
  // Which servers share a node (the config's node map, node_map.h); one node unless the config says
  // otherwise. The Ledger prices a byte that leaves its node at nodes.inter_node_byte_cost.
  plan::NodeMap nodes;
  // Set by an algorithm that balances predicted time (its prepare()): cost() is then in dense-rate
  // score entries (plan_time.h), which are not additive: a range cut in two costs more than it did.
  const plan::RateTable* rates = nullptr;
  // With `rates`: remembers the costs already computed in this plan call (use_rate_table makes it; a
  // pure function's memo, so cost() stays const). Null: every cost is computed afresh.
  std::shared_ptr<plan::TimeCostMemo> time_costs;

  // Forced inline: with the memo's lookup in it, the compiler stopped inlining it into the greedy's
  // binary searches, which cost the FLOP mode a few percent.
  [[gnu::always_inline]] int64_t cost(int64_t q_begin, int64_t q_end, const Doc& doc) const {
    if (rates != nullptr) {
      if (time_costs != nullptr) return time_costs->cost(q_begin, q_end, doc.len);
      return plan::time_weighted_cost(q_begin, q_end, doc.len, model.causal, *rates);
    }
    return plan::task_cost(q_begin, q_end, doc.len, model);  // the plain causal formula without a window
  }
};

// Reads the optional config key `key` (a rate-table path, configs/calibration/*.json) at create time;
// null when absent. Fails INVALID_ARGUMENT naming the key and the file's problem.
std::shared_ptr<const plan::RateTable> read_rate_table_key(plugin::ConfigReader& config, const std::string& key);
// Attaches `table` to the problem, after checking it was measured at the problem's head dim, with a
// memo of the costs unless `memo` is false (tests compare plans made both ways: they must be equal).
void use_rate_table(Problem& problem, const std::shared_ptr<const plan::RateTable>& table, bool memo = true);

// Validates the ABI input (struct sizes, cost params, every piece: len >= 1, inside its document, one
// agreed doc_len per document, the pieces of a document tiling [0, doc_len) exactly once) and copies
// it. Throws Failure(INVALID_ARGUMENT) naming the rank, the piece index and the document.
Problem read_input(const cad_balance_input_v1_t* input);

inline cad_task_v1_t make_task(int64_t doc_id, int64_t q_begin, int64_t q_end, int32_t server) {
  return cad_task_v1_t{doc_id, q_begin, q_end, server, 0};
}

// Every piece on its owner (rank r = server r).
Tasks colocated_tasks(const Problem& problem);

// A contiguous query range of one document that a server still computes; algorithms cut shards
// from it. `doc` indexes Problem::docs.
struct Range {
  int32_t doc;
  int64_t begin;
  int64_t end;
};
// The colocated starting point as ranges per server.
std::vector<std::vector<Range>> colocated_ranges(const Problem& problem);

// Load, traffic and memory while an algorithm moves shards; it starts at the colocated plan and uses
// the definitions of plan_model.h, so that what it predicts is what evaluate_plan reports (its
// memory figure is an upper bound: it never forgets a KV prefix a server stopped needing).
class Ledger {
 public:
  explicit Ledger(const Problem& problem);

  struct Delta {
    int64_t bytes = 0;        // forward traffic the move adds (Q out, O + LSE back, new KV tokens)
    int64_t inter_bytes = 0;  // the part of `bytes` whose owner lives on another node than the destination
    int64_t memory = 0;       // foreign Q/K/V/O bytes the destination would hold in addition
    // `bytes` priced by the problem's node map (node_map.h): = bytes on one node.
    double priced(const plan::NodeMap& nodes) const { return nodes.priced(bytes, inter_bytes); }
  };
  // What moving queries [q_begin, q_end) of docs[doc] onto `server` would add.
  Delta delta(int32_t doc, int64_t q_begin, int64_t q_end, int32_t server) const;
  // Apply that move: the cost leaves `from` and arrives at `to`.
  void commit(int32_t doc, int64_t q_begin, int64_t q_end, int32_t from, int32_t to);

  // The end of the KV range of docs[doc] that `server` already holds or receives (a prefix [0, end)
  // without a window).
  int64_t kv_prefix(int32_t doc, int32_t server) const {
    auto it = kv_.find(key(doc, server));
    return it == kv_.end() ? 0 : it->second.end;
  }
  int64_t load(int32_t server) const { return load_[static_cast<size_t>(server)]; }
  int64_t memory(int32_t server) const { return memory_[static_cast<size_t>(server)]; }
  const std::vector<int64_t>& loads() const { return load_; }
  // Corrects a server's load by `delta` (time-weighted costs: what cutting a range costs on top).
  void adjust_load(int32_t server, int64_t delta) { load_[static_cast<size_t>(server)] += delta; }
  bool fits_memory(int32_t server, int64_t extra) const {
    return problem_.memory_cap == 0 || memory(server) + extra <= problem_.memory_cap;
  }

 private:
  // Tokens of doc in [begin, end) held by ranks other than `server`, and of those, how many by ranks of
  // another node.
  struct Foreign {
    int64_t tokens = 0;
    int64_t inter = 0;
  };
  Foreign foreign(const Doc& doc, int64_t begin, int64_t end, int32_t server) const;
  int64_t foreign_tokens(const Doc& doc, int64_t begin, int64_t end, int32_t server) const {
    return foreign(doc, begin, end, server).tokens;
  }
  plan::KvRange kv_needed(int32_t doc, int64_t q_begin, int64_t q_end) const;
  const Problem& problem_;
  std::vector<int64_t> load_;
  std::vector<int64_t> memory_;
  // (doc, server) -> KV range already there (the hull of what its tasks read). A hash map: delta() looks
  // it up for every candidate (the hottest call under a memory cap); nothing iterates it in an order
  // that matters.
  static uint64_t key(int32_t doc, int32_t server) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(doc)) << 32) | static_cast<uint32_t>(server);
  }
  std::unordered_map<uint64_t, plan::KvRange> kv_;
};

// Sorts tasks by (server, doc_id, q_begin) and merges tasks of one document that touch on one server.
void normalize(Tasks& tasks);
// The plan invariant: per document the tasks partition [0, doc_len); servers in range. INTERNAL if not.
void check_partition(const Problem& problem, const Tasks& tasks);
// No server receives more than memory_cap_bytes of foreign Q/K/V/O; UNSUPPORTED naming the server.
void check_memory_cap(const Problem& problem, const Tasks& tasks);

// A plan in one allocation (header + task array), released with free_plan.
cad_plan_v1_t* allocate_plan(int32_t num_servers, const Tasks& tasks);
void free_plan(cad_plan_v1_t* plan);

// ---- ABI glue --------------------------------------------------------------------------------------
// An algorithm type provides:
//   static constexpr const char* kName, kDescription;
//   explicit Algo(plugin::ConfigReader& config);            // reads its keys
//   Tasks plan(const Problem& problem, const plugin::Logger& log) const;  // any task order
// and optionally
//   void prepare(Problem& problem) const;  // e.g. attach a rate table before planning
template <class Algo, class = void>
struct HasPrepare : std::false_type {};
template <class Algo>
struct HasPrepare<Algo, std::void_t<decltype(std::declval<const Algo&>().prepare(std::declval<Problem&>()))>>
    : std::true_type {};

template <class Algo>
struct Context {
  plugin::ErrorState error;
  plugin::Logger logger;
  NodeMapConfig topology;  // every balancer's node-map keys (balancer_topology.h), read beside the algorithm's
  Algo algo;
  Context(const cad_host_services_v1_t* services, const char* config_json)
      : logger(services, std::string("balancer '") + Algo::kName + "'"),
        algo(read_config(config_json, logger, topology)) {
    check_node_map_agrees(services, topology, logger);
  }

 private:
  static Algo read_config(const char* config_json, const plugin::Logger& logger, NodeMapConfig& topology) {
    plugin::ConfigReader reader(config_json, std::string("plugin '") + Algo::kName + "' config");
    topology = read_node_map(reader);
    Algo algo(reader);
    reader.finish(logger);
    return algo;
  }
};

// With a node map over several nodes: the plan's bytes inside and across nodes, for the debug log (every
// balancer accounts for the topology; prefix_aware also plans by it).
void log_node_bytes(const Problem& problem, const Tasks& tasks, const plugin::Logger& log);

// Runs the whole plan call: validate, algorithm, canonical form, invariant and memory checks.
template <class Algo>
cad_status_t run_plan(void* ctx, const cad_balance_input_v1_t* input, cad_plan_v1_t** out_plan) noexcept {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  auto* c = static_cast<Context<Algo>*>(ctx);
  return plugin::guarded(c->error, [&] {
    if (out_plan == nullptr) plugin::fail(CAD_STATUS_INVALID_ARGUMENT, "plan: out_plan is NULL");
    Problem problem = read_input(input);
    problem.nodes = c->topology.nodes;
    if constexpr (HasPrepare<Algo>::value) c->algo.prepare(problem);
    Tasks tasks = c->algo.plan(problem, c->logger);
    normalize(tasks);
    check_partition(problem, tasks);
    check_memory_cap(problem, tasks);
    log_node_bytes(problem, tasks, c->logger);
    *out_plan = allocate_plan(problem.num_servers, tasks);
  });
}

template <class Algo>
struct Plugin {
  static void destroy(void* ctx) { delete static_cast<Context<Algo>*>(ctx); }
  static const char* last_error(void* ctx) {
    return ctx == nullptr ? "balancer context is NULL" : static_cast<Context<Algo>*>(ctx)->error.text();
  }
  static void release_plan(void*, cad_plan_v1_t* plan) { free_plan(plan); }

  static const cad_plugin_v1_t* entry() {
    static const cad_balancer_v1_t table = {sizeof(cad_balancer_v1_t), &plugin::create_context<Context<Algo>>,
                                            &destroy, &last_error, &run_plan<Algo>, &release_plan};
    static const cad_plugin_v1_t plugin = {sizeof(cad_plugin_v1_t), CAD_ABI_VERSION_MAJOR, CAD_ABI_VERSION_MINOR,
                                           CAD_PLUGIN_KIND_BALANCER, Algo::kName, "0.1.0", Algo::kDescription,
                                           nullptr, nullptr, &table};
    return &plugin;
  }
};

}  // namespace cad::balancer

// Defines the plugin's one exported symbol for algorithm type `Algo`.
#define CAD_BALANCER_PLUGIN(Algo)                                               \
  extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { \
    return ::cad::balancer::Plugin<Algo>::entry();                              \
  }
