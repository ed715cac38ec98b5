// plan_long_docs.cpp -- see plan_long_docs.h.
#include "plan_long_docs.h"
#include "plan_topology.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "balancer_names.h"
#include "balancer_runner.h"
#include "cli_args.h"
#include "doc_lengths.h"
#include "long_docs.h"
#include "plan_cost_args.h"
#include "plan_limits.h"
#include "plan_model.h"
#include "server_memory.h"

namespace cad::cli {

namespace {

const char* kLongUsage =
    "\nDocuments longer than one rank (the layout of cad.pack_documents: the step's documents in order, cut\n"
    "wherever a rank's buffer ends into pieces of one document on consecutive ranks, positions continuous):\n"
    "       cad plan --dist FILE --max-doc-len N --tokens-per-rank T --ranks R [--seed S]   (a sampled batch)\n"
    "       cad plan --lengths FILE --tokens-per-rank T --ranks R [--max-doc-len N]         (one given batch)\n"
    "                [--balancer NAME|all] [--tolerance T] [--config JSON] [--heads H] [--kv-heads H]\n"
    "                [--head-dim D] [--bytes-per-element B] [--min-shard N] [--memory-cap BYTES]\n"
    "                [--noncausal] [--window LEFT] [--repeat N] [--per-server] [--json [--tasks]] [--path DIRS]\n"
    "  --max-doc-len N      the longest document: with --dist, DistCA's recipe scales lengths by N/65536 (its\n"
    "                       64K documents become N long) instead of by the tokens per rank; with --lengths, a\n"
    "                       longer document is refused. At most 2^40\n"
    "  --tokens-per-rank T  tokens of one rank's buffer; the documents must fill R x T tokens (what does not\n"
    "                       fit is dropped from the end, the last document shortened to what fits)\n"
    "  --memory-cap B       most Q/K/V/O bytes a server may receive: prefix_aware plans within it, the other\n"
    "                       balancers refuse a plan over it; a plan a balancer returns over it anyway is\n"
    "                       refused naming the server and the document; a layout no plan fits (a document's\n"
    "                       last query needs more bytes from other ranks than B on every rank) is refused\n"
    "                       before planning, naming the document, the rank and the bytes\n"
    "  Reports per balancer max/mean attention cost, forward bytes moved, and memory per server: the K/V rows\n"
    "  it holds (one copy of each document's prefix it needs, own rows and received) and the Q/K/V/O bytes it\n"
    "  receives. colocated over pieces is the all-gather-KV context parallelism; per_doc_cp the head/tail one.\n"
    "  --tasks (with --json) adds every rank's pieces, the document stream laid out (\"stream\") and every\n"
    "  plan's tasks. --rate-table, --balance-time and --plot are not taken in this mode.\n";

constexpr int64_t kMaxTokens = int64_t{1} << 40;
constexpr int64_t kMaxRanks = 8192;

struct Outcome {
  std::string name;
  cad_status_t status = CAD_STATUS_OK;
  std::string error;    // the plugin's message
  std::string refused;  // the plan does not fit --memory-cap
  std::vector<cad_task_v1_t> tasks;
  cad::plan::PlanStats stats;
  cad::workload::ServerMemory memory;
  double plan_ms = 0;
  bool ok() const { return status == CAD_STATUS_OK && refused.empty(); }
};

Outcome run_one(const std::string& name, const std::string& config, const std::string& search,
                const cad::plan::RankPieces& ranks, const cad_cost_params_v1_t& cost,
                const cad::plan::ModelParams& model, int repeat) {
  cad::simulate::BalancerRunner runner(name, config, search);
  Outcome out;
  out.name = runner.name();
  out.plan_ms = 1e300;
  for (int i = 0; i < repeat; ++i) {
    cad::simulate::BalancerRunner::Attempt a = runner.try_plan(ranks, cost);
    out.plan_ms = std::min(out.plan_ms, a.plan_ms);
    out.status = a.status;
    if (a.status != CAD_STATUS_OK) {
      out.error = a.error;
      return out;
    }
    out.tasks = std::move(a.tasks);
  }
  const int32_t servers = static_cast<int32_t>(ranks.size());
  const int64_t n = static_cast<int64_t>(out.tasks.size());
  out.stats = cad::plan::evaluate_plan(ranks, servers, out.tasks.data(), n, model);
  out.memory = cad::workload::server_memory(ranks, servers, out.tasks.data(), n, model);
  out.refused = cad::workload::plan_refusal(out.memory, cost.memory_cap_bytes);
  return out;
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }
int64_t max_of(const std::vector<int64_t>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

void print_text(const std::string& batch, const std::vector<int64_t>& before, const cad::workload::MemoryFloor& floor,
                const std::vector<Outcome>& outcomes, const PlanTopology& topology, bool per_server) {
  std::printf("%s\n", batch.c_str());
  std::printf("colocated (before): max/mean attention cost %.3f\n", cad::plan::imbalance_of(before));
  std::printf("least memory any plan needs: document %lld (%lld tokens), %.3f GiB received on rank %d\n\n",
              static_cast<long long>(floor.doc_id), static_cast<long long>(floor.doc_len), gib(floor.bytes), floor.rank);
  // max_kv_rows/max_kv_GiB: the K/V rows the fullest server holds (own and received); max_recv_mem_GiB: the
  // most Q/K/V/O bytes one server receives (what --memory-cap bounds).
  std::printf("%-14s %9s %9s %12s %14s %12s %11s %16s %8s %10s\n", "balancer", "before", "after", "bytes_GiB",
              "max_recv_GiB", "max_kv_rows", "max_kv_GiB", "max_recv_mem_GiB", "tasks", "plan_ms");
  for (const auto& o : outcomes) {
    if (o.status != CAD_STATUS_OK) {
      std::printf("%-14s error (%s): %s\n", o.name.c_str(), cad_status_name(o.status), o.error.c_str());
      continue;
    }
    std::printf("%-14s %9.3f %9.3f %12.3f %14.3f %12lld %11.3f %16.3f %8zu %10.3f\n", o.name.c_str(),
                cad::plan::imbalance_of(before), o.stats.imbalance, gib(o.stats.total_bytes),
                gib(max_of(o.stats.bytes_received)), static_cast<long long>(max_of(o.memory.kv_rows)),
                gib(max_of(o.memory.kv_bytes)), gib(max_of(o.memory.foreign_bytes)), o.tasks.size(), o.plan_ms);
    if (!o.refused.empty()) std::printf("%-14s refused: %s\n", o.name.c_str(), o.refused.c_str());
  }
  if (topology.given) {
    std::printf("\nforward GiB inside / across nodes (%d nodes of %d ranks):\n", topology.nodes.num_nodes(
                static_cast<int32_t>(before.size())), topology.nodes.ranks_per_node);
    for (const auto& o : outcomes) {
      if (o.status != CAD_STATUS_OK) continue;
      const cad::plan::NodeBytes split = cad::plan::split_by_node(o.stats, topology.nodes);
      std::printf("%-14s %10.3f / %.3f\n", o.name.c_str(), gib(split.intra_total), gib(split.inter_total));
    }
  }
  if (!per_server) return;
  std::printf("\nper server: attention cost (score entries / 1e9) and K/V GiB held, before and after:\n%-8s %10s",
              "server", "before");
  for (const auto& o : outcomes) std::printf(" %22s", o.name.c_str());
  std::printf("\n");
  for (size_t s = 0; s < before.size(); ++s) {
    std::printf("%-8zu %10.3f", s, static_cast<double>(before[s]) / 1e9);
    for (const auto& o : outcomes) {
      if (o.status != CAD_STATUS_OK) {
        std::printf(" %22s", "-");
        continue;
      }
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.3f / %.3f", static_cast<double>(o.stats.cost[s]) / 1e9,
                    gib(o.memory.kv_bytes[s]));
      std::printf(" %22s", cell);
    }
    std::printf("\n");
  }
}

nlohmann::json pieces_json(const cad::plan::RankPieces& pieces) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : pieces) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& p : r) list.push_back({p.doc_id, p.doc_len, p.offset_in_doc, p.len});
    ranks.push_back(list);
  }
  return ranks;
}

nlohmann::json to_json(const nlohmann::json& batch, const std::vector<int64_t>& before,
                       const cad::workload::MemoryFloor& floor, const std::vector<Outcome>& outcomes,
                       const PlanTopology& topology, const cad::plan::RankPieces* pieces,
                       const std::vector<int64_t>* stream) {
  nlohmann::json out;
  out["batch"] = batch;
  if (pieces != nullptr) out["pieces"] = pieces_json(*pieces);
  if (stream != nullptr) out["stream"] = *stream;
  out["cost_before"] = before;
  out["imbalance_before"] = cad::plan::imbalance_of(before);
  out["memory_floor"] = {{"doc_id", floor.doc_id}, {"doc_len", floor.doc_len}, {"rank", floor.rank},
                         {"keys", {floor.keys.begin, floor.keys.end}}, {"held", floor.held}, {"bytes", floor.bytes}};
  out["balancers"] = nlohmann::json::array();
  for (const auto& o : outcomes) {
    nlohmann::json b;
    b["name"] = o.name;
    b["status"] = cad_status_name(o.status);
    if (o.status != CAD_STATUS_OK) {
      b["error"] = o.error;
    } else {
      b["imbalance"] = o.stats.imbalance;
      b["cost"] = o.stats.cost;
      b["bytes_total"] = o.stats.total_bytes;
      b["bytes_received"] = o.stats.bytes_received;
      if (topology.given) b.update(node_bytes_json(o.stats, topology));
      b["kv_rows"] = o.memory.kv_rows;
      b["kv_bytes"] = o.memory.kv_bytes;
      b["memory_received"] = o.memory.foreign_bytes;
      b["max_kv_rows"] = max_of(o.memory.kv_rows);
      b["max_kv_bytes"] = max_of(o.memory.kv_bytes);
      b["max_memory_received"] = max_of(o.memory.foreign_bytes);
      if (!o.refused.empty()) b["refused"] = o.refused;
      b["tasks"] = o.tasks.size();
      if (pieces != nullptr) {
        nlohmann::json list = nlohmann::json::array();
        for (const auto& t : o.tasks) list.push_back({t.doc_id, t.q_begin, t.q_end, t.server});
        b["task_list"] = list;
      }
    }
    b["plan_ms"] = o.plan_ms;
    out["balancers"].push_back(b);
  }
  return out;
}

}  // namespace

bool wants_long_docs(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    for (const char* option : {"--max-doc-len", "--tokens-per-rank"}) {
      const size_t n = std::strlen(option);
      if (std::strncmp(argv[i], option, n) == 0 && (argv[i][n] == '\0' || argv[i][n] == '=')) return true;
    }
  }
  return false;
}

const char* long_docs_usage() { return kLongUsage; }

int run_plan_long_docs(int argc, char** argv) {
  const Args args(argc, argv,
                  {"--dist", "--lengths", "--max-doc-len", "--tokens-per-rank", "--context", "--ranks", "--seed",
                   "--balancer", "--tolerance", "--config", "--heads", "--kv-heads", "--head-dim", "--bytes-per-element",
                   "--min-shard", "--memory-cap", "--repeat", "--path", "--window", "--rate-table", "--plot",
                   kRanksPerNode, kInterNodeCost},
                  {"--noncausal", "--json", "--per-server", "--tasks", "--balance-time"});
  if (args.help()) {
    std::fputs(kLongUsage, stdout);
    std::fputs(topology_usage(), stdout);
    return 0;
  }
  if (!args.positional().empty()) throw UsageError("unexpected argument '" + args.positional()[0] + "'");
  for (const char* option : {"--rate-table", "--balance-time", "--plot"}) {
    if (args.has(option)) throw UsageError(std::string(option) + " is not taken with --max-doc-len/--tokens-per-rank");
  }
  if (args.has("--context")) {
    throw UsageError("--context is the DistCA recipe's tokens per rank; with --max-doc-len give --tokens-per-rank");
  }
  const bool sampled = args.has("--dist");
  if (sampled == args.has("--lengths")) throw UsageError("give exactly one of --dist and --lengths");
  if (!args.has("--ranks")) throw UsageError("--ranks is required");
  if (!args.has("--tokens-per-rank")) throw UsageError("--tokens-per-rank is required with --max-doc-len");
  if (sampled && !args.has("--max-doc-len")) throw UsageError("--max-doc-len is required with --dist and --tokens-per-rank");
  if (args.has("--tasks") && !args.has("--json")) throw UsageError("--tasks needs --json");
  const int32_t ranks = static_cast<int32_t>(args.get_int("--ranks", 1, 1, kMaxRanks));
  const int64_t tokens_per_rank = args.get_int("--tokens-per-rank", 0, 1, kMaxTokens);
  const int64_t max_doc_len = args.get_int("--max-doc-len", 0, 1, kMaxTokens);  // 0: not given (--lengths)
  const int64_t seed = args.get_int("--seed", 1, 0, INT64_MAX);
  const int repeat = static_cast<int>(args.get_int("--repeat", 1, 1, 1000));
  const PlanTopology topology = plan_topology(args, ranks);
  const std::string which = args.get("--balancer", "all");
  const std::vector<std::string> names = which == "all" ? builtin_balancers() : std::vector<std::string>{which};
  if (args.has("--config") && names.size() != 1) throw UsageError("--config needs a single --balancer");
  const std::string search = args.get("--path", "");
  for (const auto& name : names) require_balancer("--balancer", name, search, {"all"});

  // The cost model: the same options, defaults and refusals as the rest of `cad plan`.
  const cad_cost_params_v1_t cost = plan_cost_params(args);
  const cad::plan::ModelParams model = cad::plan::model_params(cost);

  // The layout.
  const std::string file = sampled ? args.get("--dist", "") : args.get("--lengths", "");
  const std::vector<int64_t> lengths = cad::workload::load_lengths(file);
  if (lengths.empty()) throw std::runtime_error(file + ": no document lengths");
  cad::plan::RankPieces pieces;
  std::vector<int64_t> stream;
  try {
    if (sampled) {
      pieces = cad::workload::sample_long_batch(lengths, max_doc_len, tokens_per_rank, ranks,
                                                static_cast<uint64_t>(seed), &stream);
    } else {
      pieces = cad::workload::pack_whole(lengths, tokens_per_rank, ranks, max_doc_len);
      // The documents laid out (ids are indices in the list; the rest were dropped from the end).
      int64_t laid = 0;
      for (const auto& r : pieces)
        for (const auto& p : r) laid = std::max<int64_t>(laid, p.doc_id + 1);
      stream.assign(lengths.begin(), lengths.begin() + laid);
    }
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(file + ": " + e.what());
  }
  const cad::workload::LayoutSummary summary = cad::workload::summarize(pieces);
  nlohmann::json batch = {{"source", file}, {"sampled", sampled}, {"ranks", ranks},
                          {"tokens_per_rank", tokens_per_rank}, {"max_doc_len", max_doc_len},
                          {"tokens", summary.tokens}, {"documents", summary.documents}, {"pieces", summary.pieces},
                          {"longest", summary.longest}, {"widest_span", summary.widest_span},
                          {"causal", cost.causal == 1}, {"window_left", cost.window_left},
                          {"memory_cap", cost.memory_cap_bytes}};
  if (sampled) batch["seed"] = seed;
  if (topology.given) batch["topology"] = topology_json(topology, ranks);
  const std::string overflow = cad::plan::model_overflow(pieces, ranks, model);
  if (!overflow.empty()) throw std::runtime_error(file + ": " + overflow);
  // A layout no plan fits is refused before any balancer runs (never an out-of-memory mid-step).
  const cad::workload::MemoryFloor floor = cad::workload::largest_memory_floor(pieces, model);
  const std::string no_fit = cad::workload::layout_refusal(floor, cost.memory_cap_bytes);
  if (!no_fit.empty()) throw std::runtime_error(file + ": " + no_fit);
  const std::vector<int64_t> before = cad::plan::colocated_cost(pieces, model);

  std::vector<Outcome> outcomes;
  for (const auto& name : names) {
    const std::string config =
        with_topology(balancer_config(name, args.get("--config", "{}"), args.get("--tolerance", ""), ""), topology);
    outcomes.push_back(run_one(name, config, search, pieces, cost, model, repeat));
  }

  if (args.has("--json")) {
    const bool tasks = args.has("--tasks");
    const nlohmann::json out =
        to_json(batch, before, floor, outcomes, topology, tasks ? &pieces : nullptr, tasks ? &stream : nullptr);
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::string line = "batch: long documents, " + file;
    if (sampled) line += " (seed " + std::to_string(seed) + ", max doc " + std::to_string(max_doc_len) + " tokens)";
    line += ", " + std::to_string(ranks) + " ranks x " + std::to_string(tokens_per_rank) + " tokens, " +
            std::to_string(summary.documents) + " documents in " + std::to_string(summary.pieces) +
            " pieces, the longest " + std::to_string(summary.longest) + " tokens; a document spans up to " +
            std::to_string(summary.widest_span) + " ranks; " + (cost.causal ? "causal" : "non-causal");
    if (cost.window_left >= 0) line += ", window " + std::to_string(cost.window_left);
    line += "; Hq=" + std::to_string(cost.num_q_heads) + " Hkv=" + std::to_string(cost.num_kv_heads) +
            " D=" + std::to_string(cost.head_dim) + ", min shard " + std::to_string(cost.min_shard_tokens);
    if (cost.memory_cap_bytes > 0) line += ", memory cap " + std::to_string(cost.memory_cap_bytes) + " bytes";
    print_text(line, before, floor, outcomes, topology, args.has("--per-server") || ranks <= 16);
  }
  for (const auto& o : outcomes)
    if (!o.ok()) return 1;
  return 0;
}

}  // namespace cad::cli
