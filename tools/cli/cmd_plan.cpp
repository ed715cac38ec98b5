// cmd_plan.cpp -- `cad plan`: the balancer inspector. Builds one step's piece tables (a Pretrain-style
// sample with DistCA's recipe, or a given list of document lengths packed into R ranks), runs one or all
// balancer plugins on them through the ABI, and reports what plan_model says about each plan: cost per
// server before and after, max/mean imbalance, bytes moved (total, per server, per link) and plan time.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "balancer_names.h"
#include "plan_cost_args.h"
#include "balancer_runner.h"
#include "batch_recipe.h"
#include "cli_args.h"
#include "command.h"
#include "plan_plot.h"
#include "doc_lengths.h"
#include "plan_limits.h"
#include "plan_model.h"
#include "plan_long_docs.h"
#include "plan_time.h"
#include "plan_topology.h"
#include "rate_table.h"

namespace {

using cad::cli::UsageError;

const char* kUsage =
    "usage: cad plan --dist FILE --context N --ranks R [--seed S]       (a sampled batch)\n"
    "       cad plan --lengths FILE --ranks R [--context N]             (one given batch)\n"
    "                [--balancer NAME|all] [--tolerance T] [--config JSON] [--heads H] [--kv-heads H]\n"
    "                [--head-dim D] [--bytes-per-element B] [--min-shard N] [--memory-cap BYTES]\n"
    "                [--noncausal] [--window LEFT] [--repeat N] [--per-server] [--json] [--plot OUT.png]\n"
    "                [--path DIRS] [--rate-table FILE [--balance-time]] [--tasks]\n"
    "                [--ranks-per-node N [--inter-node-cost C]]\n"
    "       cad plan ... --max-doc-len N --tokens-per-rank T   (documents longer than a rank: see below)\n\n"
    "Runs balancer plugins on one step's piece tables and prints, per balancer, the attention cost per\n"
    "server before (colocated) and after, max/mean imbalance, forward bytes moved and the plan time.\n\n"
    "  --dist FILE       document lengths (JSON list or CSV) to sample from with DistCA's recipe: cut at\n"
    "                    64K, upsample 64K chunks twice, keep 90% of the rest, shuffle with --seed, scale\n"
    "                    by context/65536, pack into R buffers of --context tokens\n"
    "  --lengths FILE    the documents of ONE batch, packed in order into R buffers of --context tokens\n"
    "                    (default: the total divided by R, rounded up)\n"
    "  --context N       tokens per rank (required with --dist; at most 2^40). Batches whose attention\n"
    "                    cost or bytes do not fit the model's int64 counters are refused\n"
    "  --ranks R         ranks = servers (at most 8192)\n"
    "  --seed S          sampling seed (default 1)\n"
    "  --balancer NAME   a balancer plugin name or path, or 'all' = colocated, per_doc_cp, distca,\n"
    "                    prefix_aware (default all)\n"
    "  --tolerance T     sets \"tolerance\" in the config of distca and prefix_aware\n"
    "  --config JSON     config of the balancer (with a single --balancer)\n"
    "  --heads H, --kv-heads H, --head-dim D, --bytes-per-element B   cost model (default 32, 8, 128, 2)\n"
    "  --min-shard N     shortest efficient shard in tokens (default 128)\n"
    "  --memory-cap B    most Q/K/V/O bytes one server may receive (default 0 = no cap)\n"
    "  --noncausal       full attention inside each document\n"
    "  --window LEFT     sliding window: a query at position p sees keys [p - LEFT, p] of its document\n"
    "                    default -1 = none. Not with --noncausal (CAD refuses non-causal windows:\n"
    "                    UNSUPPORTED) nor with --rate-table\n"
    "  --repeat N        plan N times and report the fastest (default 1)\n"
    "  --per-server      print the per-server table even for many ranks (default: up to 16 ranks)\n"
    "  --json            machine-readable output\n"
    "  --tasks           with --json: also every rank's pieces [doc, doc_len, offset, len] and every plan's\n"
    "                    tasks [doc, q_begin, q_end, server] (to replay the server batches elsewhere)\n"
    "  --plot OUT.png    draw per-server cost before/after and bytes per link into OUT (format from its\n"
    "                    extension: png, svg, pdf); needs python3 with matplotlib, which draws the --json\n"
    "                    report (cli/plot_plan.py; installed in share/cad). Prints the path written\n"
    "  --path DIRS       directories searched for plugins first (colon-separated)\n"
    "  --rate-table FILE measured kernel rates (configs/calibration/h200.json): also report each plan's\n"
    "                    predicted attention time per server (forward + backward) and its max/mean\n"
    "  --balance-time    hand FILE to prefix_aware as its \"rate_table\" config key, so that it balances\n"
    "                    predicted time instead of FLOPs; it keeps that plan only where FILE predicts its\n"
    "                    max/mean lower than FLOP balancing's by more than \"min_time_gain\" (default 0.015;\n"
    "                    --config '{\"min_time_gain\": 0}' always keeps it), else it returns the FLOP plan\n";

constexpr int64_t kMaxContext = int64_t{1} << 40;
constexpr int64_t kMaxRanks = 8192;

struct Outcome {
  std::string name;
  cad_status_t status = CAD_STATUS_OK;
  std::string error;
  std::vector<cad_task_v1_t> tasks;
  cad::plan::PlanStats stats;
  std::vector<double> seconds;  // predicted per server (with --rate-table)
  double plan_ms = 0;
};

// What `cad plan` reports in predicted time (with --rate-table): per server, before and after.
struct TimeReport {
  const cad::plan::RateTable* table = nullptr;
  std::vector<double> before;
};

// Loads one balancer plugin, creates an instance with `config`, plans `repeat` times (fastest counts).
Outcome run_balancer(const std::string& name, const std::string& config, const std::string& search_path,
                     const cad::plan::RankPieces& ranks, const cad_cost_params_v1_t& cost,
                     const cad::plan::ModelParams& model, int repeat, const cad::plan::RateTable* rates) {
  cad::simulate::BalancerRunner runner(name, config, search_path);
  Outcome out;
  out.name = runner.name();
  out.plan_ms = 1e300;
  for (int i = 0; i < repeat; ++i) {
    cad::simulate::BalancerRunner::Attempt a = runner.try_plan(ranks, cost);
    out.plan_ms = std::min(out.plan_ms, a.plan_ms);
    out.status = a.status;
    if (a.status != CAD_STATUS_OK) {
      out.error = a.error;
      break;
    }
    out.tasks = std::move(a.tasks);
  }
  if (out.status == CAD_STATUS_OK) {
    out.stats = cad::plan::evaluate_plan(ranks, static_cast<int32_t>(ranks.size()), out.tasks.data(),
                                         static_cast<int64_t>(out.tasks.size()), model);
    if (rates != nullptr) {
      out.seconds = cad::plan::server_seconds(ranks, static_cast<int32_t>(ranks.size()), out.tasks.data(),
                                              static_cast<int64_t>(out.tasks.size()), model, *rates);
    }
  }
  return out;
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

void print_cost_per_server(const std::vector<int64_t>& before, const std::vector<Outcome>& outcomes);
void print_node_bytes_per_server(size_t servers, const std::vector<Outcome>& outcomes,
                                 const cad::cli::PlanTopology& topology);

void print_text(const std::string& batch, const std::vector<int64_t>& before, const std::vector<Outcome>& outcomes,
                const TimeReport& time, const cad::cli::PlanTopology& topology, bool per_server) {
  std::printf("%s\n", batch.c_str());
  std::printf("colocated (before): max/mean attention cost %.3f", cad::plan::imbalance_of(before));
  if (time.table != nullptr) {
    std::printf(", predicted time %.3f (rates: %s, %s)", cad::plan::imbalance_of(time.before), time.table->path.c_str(),
                time.table->gpu.c_str());
  }
  // "before"/"after": max/mean of FLOPs; "time_before"/"time_after": of predicted time (--rate-table).
  std::printf("\n\n%-14s %9s %9s", "balancer", "before", "after");
  if (time.table != nullptr) std::printf(" %11s %10s", "time_before", "time_after");
  std::printf(" %12s %14s", "bytes_GiB", "max_recv_GiB");
  if (topology.given) std::printf(" %10s %10s", "intra_GiB", "inter_GiB");
  std::printf(" %8s %10s\n", "tasks", "plan_ms");
  for (const auto& o : outcomes) {
    if (o.status != CAD_STATUS_OK) {
      std::printf("%-14s error (%s): %s\n", o.name.c_str(), cad_status_name(o.status), o.error.c_str());
      continue;
    }
    const int64_t max_recv = *std::max_element(o.stats.bytes_received.begin(), o.stats.bytes_received.end());
    std::printf("%-14s %9.3f %9.3f", o.name.c_str(), cad::plan::imbalance_of(before), o.stats.imbalance);
    if (time.table != nullptr) {
      std::printf(" %11.3f %10.3f", cad::plan::imbalance_of(time.before), cad::plan::imbalance_of(o.seconds));
    }
    std::printf(" %12.3f %14.3f", gib(o.stats.total_bytes), gib(max_recv));
    if (topology.given) {
      const cad::plan::NodeBytes split = cad::plan::split_by_node(o.stats, topology.nodes);
      std::printf(" %10.3f %10.3f", gib(split.intra_total), gib(split.inter_total));
    }
    std::printf(" %8zu %10.3f\n", o.tasks.size(), o.plan_ms);
  }
  if (per_server) print_cost_per_server(before, outcomes);
  if (per_server && topology.given) print_node_bytes_per_server(before.size(), outcomes, topology);
}

void print_cost_per_server(const std::vector<int64_t>& before, const std::vector<Outcome>& outcomes) {
  std::printf("\nattention cost per server (score entries / 1e9), before and after:\n%-8s %10s", "server", "before");
  for (const auto& o : outcomes) std::printf(" %14s", o.name.c_str());
  std::printf("\n");
  for (size_t s = 0; s < before.size(); ++s) {
    std::printf("%-8zu %10.3f", s, static_cast<double>(before[s]) / 1e9);
    for (const auto& o : outcomes) {
      if (o.status == CAD_STATUS_OK) std::printf(" %14.3f", static_cast<double>(o.stats.cost[s]) / 1e9);
      else std::printf(" %14s", "-");
    }
    std::printf("\n");
  }
}

// Per server, each plan's forward bytes inside and across nodes (what it sends plus what it receives).
void print_node_bytes_per_server(size_t servers, const std::vector<Outcome>& outcomes,
                                 const cad::cli::PlanTopology& topology) {
  std::printf("\nforward GiB per server inside / across nodes (sent + received; %d ranks per node):\n%-8s %6s",
              topology.nodes.ranks_per_node, "server", "node");
  for (const auto& o : outcomes) std::printf(" %20s", o.name.c_str());
  std::printf("\n");
  std::vector<cad::plan::NodeBytes> splits;
  for (const auto& o : outcomes) {
    splits.push_back(o.status == CAD_STATUS_OK ? cad::plan::split_by_node(o.stats, topology.nodes)
                                               : cad::plan::NodeBytes{});
  }
  for (size_t s = 0; s < servers; ++s) {
    std::printf("%-8zu %6d", s, topology.nodes.node_of(static_cast<int32_t>(s)));
    for (size_t i = 0; i < outcomes.size(); ++i) {
      if (outcomes[i].status != CAD_STATUS_OK) {
        std::printf(" %20s", "-");
        continue;
      }
      const cad::plan::NodeBytes& b = splits[i];
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.3f / %.3f", gib(b.intra_sent[s] + b.intra_received[s]),
                    gib(b.inter_sent[s] + b.inter_received[s]));
      std::printf(" %20s", cell);
    }
    std::printf("\n");
  }
}

nlohmann::json to_json(const nlohmann::json& batch, const std::vector<int64_t>& before,
                       const std::vector<Outcome>& outcomes, const TimeReport& time,
                       const cad::cli::PlanTopology& topology, const cad::plan::RankPieces* pieces) {
  nlohmann::json out;
  out["batch"] = batch;
  if (pieces != nullptr) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& r : *pieces) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& p : r) list.push_back({p.doc_id, p.doc_len, p.offset_in_doc, p.len});
      ranks.push_back(list);
    }
    out["pieces"] = ranks;
  }
  out["cost_before"] = before;
  out["imbalance_before"] = cad::plan::imbalance_of(before);
  if (time.table != nullptr) {
    out["rate_table"] = time.table->path;
    out["seconds_before"] = time.before;
    out["time_imbalance_before"] = cad::plan::imbalance_of(time.before);
  }
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
      b["flops"] = o.stats.flops;
      if (time.table != nullptr) {
        b["seconds"] = o.seconds;
        b["time_imbalance"] = cad::plan::imbalance_of(o.seconds);
      }
      b["bytes_total"] = o.stats.total_bytes;
      b["bytes_sent"] = o.stats.bytes_sent;
      b["bytes_received"] = o.stats.bytes_received;
      b["memory_received"] = o.stats.memory_received;
      nlohmann::json links = nlohmann::json::array();
      const size_t n = static_cast<size_t>(o.stats.num_nodes);
      for (size_t s = 0; s < n; ++s) {
        links.push_back(std::vector<int64_t>(o.stats.link_bytes.begin() + static_cast<std::ptrdiff_t>(s * n),
                                             o.stats.link_bytes.begin() + static_cast<std::ptrdiff_t>((s + 1) * n)));
      }
      b["link_bytes"] = links;
      if (topology.given) b.update(cad::cli::node_bytes_json(o.stats, topology));
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

int run_plan(int argc, char** argv) {
  if (cad::cli::wants_long_docs(argc, argv)) return cad::cli::run_plan_long_docs(argc, argv);
  const cad::cli::Args args(argc, argv,
                            {"--dist", "--lengths", "--context", "--ranks", "--seed", "--balancer", "--tolerance",
                             "--config", "--heads", "--kv-heads", "--head-dim", "--bytes-per-element", "--min-shard",
                             "--memory-cap", "--repeat", "--plot", "--path", "--rate-table", "--window",
                             cad::cli::kRanksPerNode, cad::cli::kInterNodeCost},
                            {"--noncausal", "--json", "--per-server", "--balance-time", "--tasks"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    std::fputs(cad::cli::topology_usage(), stdout);
    std::fputs(cad::cli::long_docs_usage(), stdout);
    return 0;
  }
  if (!args.positional().empty()) throw UsageError("unexpected argument '" + args.positional()[0] + "'");
  const bool sampled = args.has("--dist");
  if (sampled == args.has("--lengths")) throw UsageError("give exactly one of --dist and --lengths");
  if (!args.has("--ranks")) throw UsageError("--ranks is required");
  if (sampled && !args.has("--context")) throw UsageError("--context is required with --dist");
  // The report keeps a ranks x ranks matrix of link bytes per balancer: 8192 ranks is 512 MiB each.
  const int32_t ranks = static_cast<int32_t>(args.get_int("--ranks", 1, 1, kMaxRanks));
  const int64_t seed = args.get_int("--seed", 1, 0, INT64_MAX);
  const int repeat = static_cast<int>(args.get_int("--repeat", 1, 1, 1000));
  const cad::cli::PlanTopology topology = cad::cli::plan_topology(args, ranks);
  // Balancer names are checked before the batch is read or sampled: a typo costs no work.
  const std::string which = args.get("--balancer", "all");
  const std::vector<std::string> names = which == "all" ? cad::cli::builtin_balancers() : std::vector<std::string>{which};
  if (args.has("--config") && names.size() != 1) throw UsageError("--config needs a single --balancer");
  const std::string search = args.get("--path", "");
  for (const auto& name : names) cad::cli::require_balancer("--balancer", name, search, {"all"});

  const cad_cost_params_v1_t cost = plan_cost_params(args);
  if (cost.window_left >= 0 && args.has("--rate-table")) {
    throw UsageError("--window with --rate-table: the rate tables hold no rates for sliding windows");
  }
  const cad::plan::ModelParams model = cad::plan::model_params(cost);

  // The batch.
  cad::plan::RankPieces pieces;
  nlohmann::json batch;
  std::string file = sampled ? args.get("--dist", "") : args.get("--lengths", "");
  const std::vector<int64_t> lengths = cad::workload::load_lengths(file);
  if (lengths.empty()) throw std::runtime_error(file + ": no document lengths");
  int64_t context;
  if (sampled) {
    context = args.get_int("--context", 0, 1, kMaxContext);
    pieces = cad::workload::sample_batch(lengths, context, ranks, static_cast<uint64_t>(seed));
  } else {
    int64_t total = 0;  // each length <= 2^40 (doc_lengths.h); the sum may still overflow
    for (int64_t l : lengths) {
      if (__builtin_add_overflow(total, l, &total)) throw UsageError(file + ": the lengths add up to more than 2^63-1 tokens");
    }
    const int64_t share = total / ranks + (total % ranks != 0 ? 1 : 0);
    context = args.get_int("--context", std::min(share, kMaxContext), 1, kMaxContext);
    pieces = cad::workload::pack(lengths, context, ranks);
  }
  int64_t tokens = 0, piece_count = 0, docs = 0;
  for (const auto& r : pieces) {
    for (const auto& p : r) {
      tokens += p.len;
      ++piece_count;
      if (p.offset_in_doc == 0) ++docs;
    }
  }
  batch = {{"source", file}, {"sampled", sampled}, {"ranks", ranks}, {"context", context}, {"tokens", tokens},
           {"documents", docs}, {"pieces", piece_count}, {"causal", cost.causal == 1},
           {"window_left", cost.window_left}};
  if (sampled) batch["seed"] = seed;
  if (topology.given) batch["topology"] = cad::cli::topology_json(topology, ranks);
  // Refuse, with the reason, a batch whose costs or bytes would wrap the model's int64 counters.
  const std::string overflow = cad::plan::model_overflow(pieces, ranks, model);
  if (!overflow.empty()) throw std::runtime_error(file + ": " + overflow);
  const std::vector<int64_t> before = cad::plan::colocated_cost(pieces, model);

  // Predicted time (--rate-table): the colocated plan's, per server, for "time_before".
  std::unique_ptr<cad::plan::RateTable> rates;
  TimeReport time;
  if (args.has("--balance-time") && !args.has("--rate-table")) throw UsageError("--balance-time needs --rate-table");
  if (args.has("--tasks") && !args.has("--json")) throw UsageError("--tasks needs --json");
  if (args.has("--rate-table")) {
    rates = std::make_unique<cad::plan::RateTable>(cad::plan::load_rate_table(args.get("--rate-table", "")));
    std::vector<cad_task_v1_t> colocated;
    for (int32_t r = 0; r < ranks; ++r) {
      for (const auto& p : pieces[static_cast<size_t>(r)]) {
        colocated.push_back({p.doc_id, p.offset_in_doc, p.offset_in_doc + p.len, r, 0});
      }
    }
    time.table = rates.get();
    time.before = cad::plan::server_seconds(pieces, ranks, colocated.data(), static_cast<int64_t>(colocated.size()),
                                            model, *rates);
  }

  // The balancers.
  std::vector<Outcome> outcomes;
  for (const auto& name : names) {
    const std::string config = cad::cli::with_topology(
        cad::cli::balancer_config(name, args.get("--config", "{}"), args.get("--tolerance", ""),
                                  args.has("--balance-time") ? args.get("--rate-table", "") : ""),
        topology);
    outcomes.push_back(run_balancer(name, config, search, pieces, cost, model, repeat, rates.get()));
  }

  if (args.has("--json")) {
    const nlohmann::json out = to_json(batch, before, outcomes, time, topology, args.has("--tasks") ? &pieces : nullptr);
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    char line[512];
    std::snprintf(line, sizeof line,
                  "batch: %s%s, %d ranks x %lld tokens, %lld documents in %lld pieces, %s%s; Hq=%d Hkv=%d D=%d, "
                  "min shard %lld",
                  file.c_str(), sampled ? (" (seed " + std::to_string(seed) + ")").c_str() : "", ranks,
                  static_cast<long long>(context), static_cast<long long>(docs),
                  static_cast<long long>(piece_count), cost.causal ? "causal" : "non-causal",
                  cost.window_left >= 0 ? (", window " + std::to_string(cost.window_left)).c_str() : "",
                  cost.num_q_heads,
                  cost.num_kv_heads, cost.head_dim, static_cast<long long>(cost.min_shard_tokens));
    print_text(line, before, outcomes, time, topology, args.has("--per-server") || ranks <= 16);
    if (topology.given) {
      std::printf("\n%d nodes of %d ranks; a byte that leaves its node is priced at %g\n",
                  topology.nodes.num_nodes(ranks), topology.nodes.ranks_per_node, topology.nodes.inter_node_byte_cost);
    }
  }
  if (args.has("--plot")) cad::cli::plot_plan(to_json(batch, before, outcomes, time, topology, nullptr), args.get("--plot", ""));
  for (const auto& o : outcomes)
    if (o.status != CAD_STATUS_OK) return 1;
  return 0;
}

}  // namespace

CAD_REGISTER_COMMAND(plan, "plan", "run balancers on a sampled or given batch: imbalance, bytes moved, plan time",
                     run_plan);
