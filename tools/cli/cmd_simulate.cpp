// cmd_simulate.cpp -- `cad simulate`: predicted step time of CAD and its baselines for a model shape
// and parallel layout at any number of GPUs, from measured parts (attention-kernel rate table, NCCL
// all_to_all_v curve) and stated assumptions (GEMM rate, network), with the real balancer plugins'
// plans on batches sampled with DistCA's recipe. The model is tools/simulate/.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "balancer_names.h"
#include "cli_args.h"
#include "command.h"
#include "doc_lengths.h"
#include "simulate_limits.h"
#include "simulate_report.h"
#include "simulation.h"
#include "tensor_slices.h"

namespace {

using cad::cli::UsageError;
namespace sim = cad::simulate;
namespace lim = cad::cli::simulate_limits;
using namespace cad::cli::simulate_report;

const char* kUsage =
    "usage: cad simulate --gpus N --dist FILE --context TOKENS [--model llama-8b|34b] [options]\n\n"
    "Predicts one training step's time for each balancer (colocated = plain data parallelism, per_doc_cp =\n"
    "per-document context parallelism, distca, prefix_aware) with and without ping-pong, and the speedup\n"
    "over colocated and per_doc_cp. Batches are sampled from FILE with DistCA's recipe and planned by the\n"
    "balancer plugins themselves; time comes from the calibration files (docs/simulate.md).\n\n"
    "model:\n"
    "  --model NAME        preset shape: llama-8b (default) or 34b\n"
    "  --layers N --hidden N --heads N --kv-heads N --head-dim N --mlp N --vocab N   override the preset\n"
    "layout:\n"
    "  --gpus N            GPUs in all (required; at most 2^20)\n"
    "  --gpus-per-node N   (default 8; at most 1024)\n"
    "  --ranks-per-node R  data-parallel (CAD) ranks per node: sets --gpus-per-node to R x tp (the two must agree\n"
    "                      when both are given); also handed to every balancer's config as \"ranks_per_node\"\n"
    "  --inter-node-byte-cost C   handed to every balancer's config as \"inter_node_byte_cost\" (a byte that\n"
    "                      leaves its node costs C bytes; C in [1, 1e6], the balancers' range); a balancer\n"
    "                      that does not know a key warns and ignores it\n"
    "  --nic-share gpu|node  how a GPU's bytes to other nodes reach the network: gpu (default) over its own NIC;\n"
    "                      node: over the NIC of the sender's node on the destination's rail, relayed there over\n"
    "                      NVLink (NCCL's PXN), so each NIC carries what its node sends to its rail\n"
    "  --tp N              tensor-parallel size, inside a node (default 1): divides linear work and heads; each\n"
    "                      TP index runs CAD over its data group on its head slice (Hq/tp, Hkv/tp heads), so its\n"
    "                      exchanges carry that slice, and every TP index holds the same plan (made once per\n"
    "                      group and micro-batch); bytes and seconds are one GPU's\n"
    "  --pp N              pipeline stages (default 1): divides layers, adds the 1F1B fill/drain\n"
    "  --schedule 1f1b|gpipe|1f1b_ticks   with --pp: 1f1b (default) is the kernel-level 1F1B model with CAD over\n"
    "                      the data-parallel ranks; gpipe and 1f1b_ticks price the pipeline trainer\n"
    "                      (examples/train_pipeline.py --schedule gpipe / 1f1b) tick by tick: gpipe T = microbatches\n"
    "                      + pp - 1 forward ticks, then T backward; 1f1b_ticks the trainer's 1F1B timetable, each\n"
    "                      stage a forward or a backward per tick (as many ticks); both need --pp >= 2 and\n"
    "                      --trainer FILE; balancers colocated,distca,prefix_aware by default (not per_doc_cp);\n"
    "                      ping-pong is not modelled (on = off)\n"
    "  --pool tick|stage|bubble|bubble_stage\n"
    "                      with --schedule gpipe or 1f1b_ticks, how CAD balancers pool attention\n"
    "                      (colocated stays local): tick (default) = over every rank of every stage, idle stages\n"
    "                      serving (gpipe: one plan per tick; 1f1b_ticks: one per micro-batch and stage, every rank\n"
    "                      making every stage's calls of a tick); stage = within each stage's data-parallel ranks\n"
    "                      (with one replica: colocated); bubble = as tick in the ticks where some stage is idle,\n"
    "                      local attention in the others (gpipe: the fill and drain ticks and their mirrored\n"
    "                      backward ticks; 1f1b_ticks: needs --checkpointing full, each such tick's operations\n"
    "                      with their own plans, a backward recomputing under its own tick's pool);\n"
    "                      bubble_stage (gpipe only; a prediction, the trainer has no such pool yet) = as tick in\n"
    "                      the bubble ticks, as stage in the others\n"
    "                      data-parallel ranks = gpus / (tp * pp), at most 8192 (as cad plan --ranks)\n"
    "workload:\n"
    "  --dist FILE         document lengths (JSON list or CSV), e.g. ../shared/data/doclen_pretrain.json\n"
    "                      (a regular file of at most 32 MiB)\n"
    "  --context N         tokens per data-parallel rank and micro-batch (= per GPU when tp = 1; at most 2^40)\n"
    "  --max-doc-len L --tokens-per-rank T   long documents (instead of --context): the recipe's lengths scale\n"
    "                      to L (its 64K documents become L long) and are laid whole over the ranks at T tokens\n"
    "                      each, as cad.pack_documents lays them (a document cut where a rank's buffer ends lies\n"
    "                      on consecutive ranks as pieces of one document), cut only at the edges of groups of\n"
    "                      --cp-size ranks (default: a node's ranks, raised to the ranks the longest document\n"
    "                      needs and to a divisor of the data-parallel ranks); colocated then plans over those\n"
    "                      groups too (the all-gather-KV context parallelism over pieces), --cad-size must be\n"
    "                      0 or a multiple of --cp-size, and L at most --cp-size x T; --pp 1 only\n"
    "  --steps N           sampled steps (default 1; at most 10000); --seed S (default 1)\n"
    "  --microbatches N    micro-batches per step (default 1; 2 x pp with --pp; at most 4096, and at most\n"
    "                      2^20 micro-batches x data-parallel ranks)\n"
    "balancers:\n"
    "  --balancers LIST    comma-separated plugin names or paths (default colocated,per_doc_cp,distca,\n"
    "                      prefix_aware); the first two, when present, are the speedup baselines\n"
    "  --cp-size N         data-parallel ranks per per_doc_cp group (default: one node's, gpus-per-node/tp;\n"
    "                      0 = all); its plan is also its token layout, so only K/V moves\n"
    "  --cad-size N        ranks per group of every other balancer (default 0 = all ranks)\n"
    "  --min-shard N       shortest efficient shard, tokens (default 128)\n"
    "  --balance-time      give prefix_aware the rate table (its \"rate_table\" key): it then balances\n"
    "                      predicted attention time instead of FLOPs\n"
    "  --tolerance T       sets \"tolerance\" in the config of distca and prefix_aware (T in [0, 10];\n"
    "                      prefix_aware's default 0.02: servers filled up to mean x (1 + T))\n"
    "  --path DIRS         directories searched for plugins first (colon-separated)\n"
    "calibration:\n"
    "  --rates FILE        attention-kernel rate table (default configs/calibration/h200.json)\n"
    "  --system FILE       GEMM, element-wise, all_to_all curve, network (default\n"
    "                      configs/calibration/h200_system.json)\n"
    "  --attention-tflops F,B   fixed forward/backward attention rates instead of the table\n"
    "  --link-gbps X       network per GPU in Gb/s (overrides the system file's, e.g. 400; --net-gbps is the\n"
    "                      same option's old name)\n"
    "  --link-latency-us U  the network's latency per exchange, microseconds (overrides the file's; [0, 1e6])\n"
    "  --link-efficiency E  the share of --link-gbps an exchange reaches (overrides the file's; (0, 1])\n"
    "  --link-curve FILE   a fitted curve {\"source\", \"points\": [{\"bytes\", \"seconds\"}, ...]} of one GPU's\n"
    "                      exchange with other nodes (the larger of its sent and received bytes) instead of\n"
    "                      latency + bytes / bandwidth (not with the three options above)\n"
    "  --overlap F         the share of each pass's exchange the ping-pong mode (\"on\") hides, at most the\n"
    "                      pass's compute (default 1: all of it, the old unmeasured assumption; docs/simulate.md\n"
    "                      gives what has been measured); F in [0, 1]\n"
    "  --gemm-tflops X     GEMM rate of the linear layers (overrides the system file's)\n"
    "                      (rates: numbers in [0.001, 1e6])\n"
    "trainer (the step of a real trainer: examples/train_llama.py, FSDP2, gradient accumulation):\n"
    "  --trainer FILE      price the step with the overhead terms measured in that trainer (e.g.\n"
    "                      docs/simulate/trainer_h200.json: non-attention time per token and layer and\n"
    "                      outside the layers, per-step fixed time, attention kernel scale and per-call cost,\n"
    "                      plan make per plan, token and task, exchange fixed cost and pack/unpack per byte,\n"
    "                      ping-pong's compute\n"
    "                      factor); every micro-batch then waits for the slowest rank of all (FSDP2)\n"
    "  --checkpointing full|none   full activation checkpointing: each layer's forward (and CAD's forward\n"
    "                      exchange) runs twice (default full; needs --trainer)\n"
    "  --kernel ours|torch_varlen  the local attention kernel's scale from the trainer file (default ours;\n"
    "                      needs --trainer)\n"
    "  --batch-seeds LIST  comma-separated seed of every micro-batch, step by step (a multiple of\n"
    "                      --microbatches; replaces --steps and --seed): the trainer samples micro-batch m of\n"
    "                      step s with seed 1 + 1000 s + m, so its steps 1-2 of 2 micro-batches are\n"
    "                      1001,1002,2001,2002\n"
    "  --detail            with --json: every micro-batch's per-rank parts (tokens, kernel seconds, bytes,\n"
    "                      the trainer model's terms)\n"
    "output:\n"
    "  --pingpong on|off|both   which modes to print (default both; --json always has both)\n"
    "  --json              machine-readable output (what bench/simulate/simulate_table.py reads)\n"
    "  --quiet             no progress lines on stderr (each step of every balancer for 128 data-parallel\n"
    "                      ranks and more; else at most one a second once a run has lasted a second)\n";

const std::vector<std::string> kDefaultBalancers = {"colocated", "per_doc_cp", "distca", "prefix_aware"};

std::string default_calibration(const std::string& file) {
  std::vector<std::string> candidates;
#ifdef CAD_SOURCE_CONFIG_DIR
  candidates.push_back(std::string(CAD_SOURCE_CONFIG_DIR) + "/calibration/" + file);
#endif
#ifdef CAD_INSTALL_CONFIG_DIR
  candidates.push_back(std::string(CAD_INSTALL_CONFIG_DIR) + "/calibration/" + file);
#endif
  for (const auto& c : candidates) {
    if (std::filesystem::exists(c)) return c;
  }
  return candidates.empty() ? "calibration/" + file : candidates.front();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A rate: a number in [kMinRate, kMaxRate] ("1e-320", "inf" and "nan" made every time infinite or NaN).
double parse_rate(const std::string& option, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= lim::kMinRate && v <= lim::kMaxRate)) {
    throw UsageError(option + ": expected a number in [0.001, 1e6], got '" + text + "'");
  }
  return v;
}

// Progress on stderr. A large layout prints every line: each starts a plan that can take seconds, so a
// skipped line would leave the previous one on screen while other work runs. A small one prints at most
// one line a second, once the run has lasted a second (many steps or micro-batches of quick plans).
// `units` is how many lines the run will report (steps x micro-batches x balancers; steps x balancers with
// --pp): once a second has passed, each line also says how long the rest is expected to take at the rate
// measured so far, so a run of a minute or more (256 ranks x 4096 micro-batches) says so early.
std::function<void(const std::string&)> progress_printer(bool large, int64_t units) {
  using clock = std::chrono::steady_clock;
  const clock::time_point start = clock::now();
  auto last = std::make_shared<clock::time_point>(start);
  auto done = std::make_shared<int64_t>(0);
  return [start, last, done, large, units](const std::string& line) {
    const clock::time_point now = clock::now();
    const int64_t finished = (*done)++;  // lines before this one: their work is done
    if (!large && now - *last < std::chrono::seconds(1)) return;
    *last = now;
    const double elapsed = std::chrono::duration<double>(now - start).count();
    std::string eta;
    if (elapsed >= 1.0 && finished > 0 && finished < units) {
      const double left = elapsed * static_cast<double>(units - finished) / static_cast<double>(finished);
      char text[96];
      std::snprintf(text, sizeof text, " (%lld/%lld done, about %.0f s left)", static_cast<long long>(finished),
                    static_cast<long long>(units), left);
      eta = text;
    }
    std::fprintf(stderr, "[%6.1f s] %s%s\n", elapsed, line.c_str(), eta.c_str());
  };
}

// A number in [lo, hi] (finite), or a UsageError naming the option and the range.
double parse_number(const std::string& option, const std::string& text, double lo, double hi, const char* range) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= lo && v <= hi)) {
    throw UsageError(option + ": expected a number in " + range + ", got '" + text + "'");
  }
  return v;
}

// The default document group of long documents: a node's data-parallel ranks, raised to the ranks the
// longest document needs, then to the next divisor of the data-parallel ranks (all of them if none).
int64_t long_docs_group(int64_t ranks_per_node, const sim::Scenario& s) {
  const int64_t dp = s.layout.dp();
  int64_t g = std::max(ranks_per_node, (s.max_doc_len + s.context - 1) / s.context);
  while (g < dp && dp % g != 0) ++g;
  return std::min(g, dp);
}

// The balancer's config with the node map, when the command line gives it (--ranks-per-node,
// --inter-node-byte-cost): keys the topology-aware balancers read; the others warn and ignore them.
std::string with_topology(const std::string& config, const cad::cli::Args& args) {
  if (!args.has("--ranks-per-node") && !args.has("--inter-node-byte-cost")) return config;
  nlohmann::json c = nlohmann::json::parse(config);
  if (args.has("--ranks-per-node")) c["ranks_per_node"] = args.get_int("--ranks-per-node", 1, 1, lim::kMaxGpusPerNode);
  if (args.has("--inter-node-byte-cost")) {
    c["inter_node_byte_cost"] =
        parse_number("--inter-node-byte-cost", args.get("--inter-node-byte-cost", ""), 1, 1e6, "[1, 1e6]");
  }
  return c.dump();
}

// The network term from the command line over the system file's: bandwidth, latency, efficiency or a
// fitted curve, and the ping-pong mode's overlap. Each value's source says where it came from.
void set_network(sim::SystemCalibration& cal, const cad::cli::Args& args) {
  if (args.has("--net-gbps") && args.has("--link-gbps")) {
    throw UsageError("--net-gbps is --link-gbps's old name; give one of them");
  }
  const bool curve = args.has("--link-curve");
  for (const char* option : {"--net-gbps", "--link-gbps", "--link-latency-us", "--link-efficiency"}) {
    if (curve && args.has(option)) {
      throw UsageError(std::string("--link-curve gives the network's seconds by bytes; it cannot go with ") + option);
    }
  }
  std::string given;
  for (const char* option : {"--net-gbps", "--link-gbps"}) {
    if (!args.has(option)) continue;
    cal.net_GBps_per_gpu = parse_rate(option, args.get(option, "")) / 8;
    given += std::string(" ") + option + " " + args.get(option, "");
  }
  if (args.has("--link-latency-us")) {
    cal.net_latency_us = parse_number("--link-latency-us", args.get("--link-latency-us", ""), 0, 1e6, "[0, 1e6]");
    given += " --link-latency-us " + args.get("--link-latency-us", "");
  }
  if (args.has("--link-efficiency")) {
    cal.net_efficiency = parse_number("--link-efficiency", args.get("--link-efficiency", ""), 1e-3, 1, "[0.001, 1]");
    given += " --link-efficiency " + args.get("--link-efficiency", "");
  }
  if (!given.empty()) cal.net_source = given.substr(1) + " (the rest from " + cal.path + ")";
  if (curve) {
    const std::string path = args.get("--link-curve", "");
    std::string source;
    try {
      cal.net_curve = sim::load_link_curve(path, &source);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    cal.net_source = "--link-curve " + path + " (" + source + ")";
  }
  if (args.has("--overlap")) {
    cal.overlap = parse_number("--overlap", args.get("--overlap", ""), 0, 1, "[0, 1]");
    cal.overlap_source = "--overlap " + args.get("--overlap", "");
  }
}

int run_simulate(int argc, char** argv) {
  const cad::cli::Args args(
      argc, argv,
      {"--model", "--layers", "--hidden", "--heads", "--kv-heads", "--head-dim", "--mlp", "--vocab", "--gpus",
       "--gpus-per-node", "--tp", "--pp", "--dist", "--context", "--steps", "--seed", "--microbatches", "--balancers",
       "--cp-size", "--cad-size", "--min-shard", "--path", "--rates", "--system", "--attention-tflops", "--net-gbps", "--gemm-tflops",
       "--pingpong", "--trainer", "--checkpointing", "--kernel", "--batch-seeds", "--schedule", "--pool",
       "--tolerance", "--max-doc-len", "--tokens-per-rank", "--ranks-per-node", "--inter-node-byte-cost",
       "--link-gbps", "--link-latency-us", "--link-efficiency", "--link-curve", "--overlap", "--nic-share"},
      {"--json", "--quiet", "--balance-time", "--detail"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.positional().empty()) throw UsageError("unexpected argument '" + args.positional()[0] + "'");
  const bool long_docs = args.has("--max-doc-len") || args.has("--tokens-per-rank");
  if (long_docs) {
    for (const char* required : {"--max-doc-len", "--tokens-per-rank"}) {
      if (!args.has(required)) throw UsageError(std::string("long documents need --max-doc-len and --tokens-per-rank; ") +
                                                required + " is missing");
    }
    if (args.has("--context")) throw UsageError("--tokens-per-rank replaces --context with long documents; give one");
  }
  for (const char* required : {"--gpus", "--dist", long_docs ? "--tokens-per-rank" : "--context"}) {
    if (!args.has(required)) throw UsageError(std::string(required) + " is required (see --help)");
  }
  const int64_t big = int64_t{1} << 40;  // model-shape sizes (their products are checked by validate)

  sim::Scenario s;
  try {
    s.shape = sim::model_preset(args.get("--model", "llama-8b"));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--model: ") + e.what());
  }
  s.shape.layers = args.get_int("--layers", s.shape.layers, 1, big);
  s.shape.hidden = args.get_int("--hidden", s.shape.hidden, 1, big);
  s.shape.heads = args.get_int("--heads", s.shape.heads, 1, big);
  s.shape.kv_heads = args.get_int("--kv-heads", s.shape.kv_heads, 1, big);
  s.shape.head_dim = args.get_int("--head-dim", s.shape.head_dim, 1, big);
  s.shape.mlp = args.get_int("--mlp", s.shape.mlp, 1, big);
  s.shape.vocab = args.get_int("--vocab", s.shape.vocab, 0, big);
  s.layout.gpus = args.get_int("--gpus", 0, 1, lim::kMaxGpus);
  s.layout.gpus_per_node = args.get_int("--gpus-per-node", 8, 1, lim::kMaxGpusPerNode);
  s.layout.tp = args.get_int("--tp", 1, 1, lim::kMaxTp);
  if (args.has("--ranks-per-node")) {
    const int64_t r = args.get_int("--ranks-per-node", 1, 1, lim::kMaxGpusPerNode);
    if (r > lim::kMaxGpusPerNode / s.layout.tp) {
      throw UsageError("--ranks-per-node " + std::to_string(r) + " x --tp " + std::to_string(s.layout.tp) +
                       " is more than 1024 GPUs per node");
    }
    if (args.has("--gpus-per-node") && r * s.layout.tp != s.layout.gpus_per_node) {
      throw UsageError("--ranks-per-node " + std::to_string(r) + " x --tp " + std::to_string(s.layout.tp) + " = " +
                       std::to_string(r * s.layout.tp) + " GPUs per node, but --gpus-per-node is " +
                       std::to_string(s.layout.gpus_per_node));
    }
    s.layout.gpus_per_node = r * s.layout.tp;
  }
  s.layout.pp = args.get_int("--pp", 1, 1, lim::kMaxPp);
  if (args.has("--nic-share")) {
    const std::string share = args.get("--nic-share", "");
    if (share != "gpu" && share != "node") throw UsageError("--nic-share must be gpu or node, got '" + share + "'");
    s.layout.rail_routed = share == "node";
  }
  try {
    sim::validate(s.shape);
    sim::validate(s.layout, s.shape);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  if (s.layout.dp() > lim::kMaxDataParallel) {
    throw UsageError("--gpus " + std::to_string(s.layout.gpus) + " / (--tp x --pp) = " +
                     std::to_string(s.layout.dp()) + " data-parallel ranks; at most " +
                     std::to_string(lim::kMaxDataParallel) + " plan together (raise --tp or --pp)");
  }
  if (long_docs) {
    s.context = args.get_int("--tokens-per-rank", 0, 1, lim::kMaxContext);
    s.max_doc_len = args.get_int("--max-doc-len", 0, 1, lim::kMaxContext);
    if (s.layout.pp != 1) throw UsageError("--max-doc-len: long documents are modelled without pipeline stages (--pp 1)");
  } else {
    s.context = args.get_int("--context", 0, 1, lim::kMaxContext);
  }
  s.steps = args.get_int("--steps", 1, 1, lim::kMaxSteps);
  s.seed = static_cast<uint64_t>(args.get_int("--seed", 1, 0, INT64_MAX));
  s.microbatches = args.get_int("--microbatches", std::min(lim::kMaxMicrobatches, s.layout.pp > 1 ? 2 * s.layout.pp : 1),
                                1, lim::kMaxMicrobatches);
  if (s.microbatches * s.layout.dp() > lim::kMaxMicrobatchRanks) {
    throw UsageError("--microbatches " + std::to_string(s.microbatches) + " x " + std::to_string(s.layout.dp()) +
                     " data-parallel ranks is more than 2^20 (a step keeps one time per rank and micro-batch); "
                     "at most " + std::to_string(lim::kMaxMicrobatchRanks / s.layout.dp()) + " micro-batches here");
  }
  if (args.has("--batch-seeds")) {
    if (args.has("--steps") || args.has("--seed")) {
      throw UsageError("--batch-seeds names every micro-batch's seed; it cannot go with --steps or --seed");
    }
    const std::vector<std::string> seeds = split(args.get("--batch-seeds", ""), ',');
    if (seeds.empty()) throw UsageError("--batch-seeds: expected a comma-separated list of seeds, e.g. 1001,1002");
    for (const std::string& text : seeds) {
      char* end = nullptr;
      errno = 0;
      const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
      if (end == text.c_str() || *end != '\0' || errno != 0 || text[0] == '-') {
        throw UsageError("--batch-seeds: '" + text + "' is not a seed (a whole number >= 0)");
      }
      s.batch_seeds.push_back(static_cast<uint64_t>(v));
    }
    if (s.batch_seeds.size() % static_cast<size_t>(s.microbatches) != 0) {
      throw UsageError("--batch-seeds: " + std::to_string(s.batch_seeds.size()) + " seeds is not a whole number of "
                       "steps of --microbatches " + std::to_string(s.microbatches));
    }
    if (static_cast<int64_t>(s.batch_seeds.size()) > lim::kMaxSteps * s.microbatches) {
      throw UsageError("--batch-seeds: at most " + std::to_string(lim::kMaxSteps) + " steps of seeds");
    }
    s.steps = static_cast<int64_t>(s.batch_seeds.size()) / s.microbatches;
  }
  s.min_shard_tokens = args.get_int("--min-shard", 128, 0, big);
  s.search_path = args.get("--path", "");

  const int64_t ranks_per_node = s.layout.gpus_per_node / s.layout.tp;
  const int64_t cp_size = args.get_int("--cp-size", long_docs ? long_docs_group(ranks_per_node, s) : ranks_per_node, 0, big);
  if (long_docs) s.document_group = cp_size == 0 ? s.layout.dp() : std::min(cp_size, s.layout.dp());
  const int64_t cad_size = args.get_int("--cad-size", 0, 0, big);
  const std::string rates_path = args.get("--rates", default_calibration("h200.json"));
  if (args.has("--balance-time") && args.has("--attention-tflops")) {
    throw UsageError("--balance-time needs the rate table; it cannot go with --attention-tflops");
  }
  const std::string schedule = args.get("--schedule", "1f1b");
  if (schedule != "1f1b" && schedule != "gpipe" && schedule != "1f1b_ticks") {
    throw UsageError("--schedule: expected 1f1b, gpipe or 1f1b_ticks, got '" + schedule + "'");
  }
  s.schedule = schedule == "gpipe"        ? sim::Schedule::kGpipe
               : schedule == "1f1b_ticks" ? sim::Schedule::k1f1bTicks
                                          : sim::Schedule::k1f1b;
  const bool trainer_pipeline = sim::is_trainer_pipeline(s.schedule);
  if (trainer_pipeline && s.layout.pp < 2) {
    throw UsageError("--schedule " + schedule + " needs --pp >= 2 (pipeline stages), got --pp " +
                     std::to_string(s.layout.pp));
  }
  if (args.has("--schedule") && s.layout.pp < 2) {
    throw UsageError("--schedule needs --pp >= 2 (pipeline stages)");
  }
  if (args.has("--pool")) {
    if (!trainer_pipeline) throw UsageError("--pool needs --schedule gpipe or 1f1b_ticks (the pipeline trainer)");
    const std::string pool = args.get("--pool", "tick");
    if (pool != "tick" && pool != "stage" && pool != "bubble" && pool != "bubble_stage") {
      throw UsageError("--pool: expected tick, stage, bubble or bubble_stage, got '" + pool + "'");
    }
    s.pool = pool == "tick"     ? sim::PipelinePool::kTick
             : pool == "stage"  ? sim::PipelinePool::kStage
             : pool == "bubble" ? sim::PipelinePool::kBubble
                                : sim::PipelinePool::kBubbleStage;
  }
  const std::vector<std::string> names =
      args.has("--balancers") ? split(args.get("--balancers", ""), ',')
      : trainer_pipeline ? std::vector<std::string>{"colocated", "distca", "prefix_aware"}
                         : kDefaultBalancers;
  if (args.has("--pool") &&
      std::all_of(names.begin(), names.end(), [](const std::string& n) { return n == "colocated"; })) {
    throw UsageError("--pool pools CAD's attention; --balancers names no CAD balancer (colocated is local attention)");
  }
  if (names.empty()) throw UsageError("--balancers names no balancer");
  for (const auto& n : names) cad::cli::require_balancer("--balancers", n, s.search_path);
  // Checked here even where no balancer named takes it, so that a bad value is refused before any work.
  const std::string tolerance_text = args.get("--tolerance", "");
  const bool has_tolerance = args.has("--tolerance");
  const double tolerance = has_tolerance ? cad::cli::parse_tolerance(tolerance_text) : 0.0;
  for (const auto& n : names) {
    sim::BalancerSpec b;
    b.name = n;
    const bool cp = std::filesystem::path(n).stem().string().find("per_doc_cp") != std::string::npos;
    // With long documents colocated plans over the document groups: the all-gather-KV context parallelism.
    b.group_size = n == "colocated" ? (long_docs ? s.document_group : 1) : cp ? cp_size : cad_size;
    b.plan_is_layout = cp;
    b.config = with_topology(cad::cli::balancer_config(n, "{}", tolerance_text, args.has("--balance-time") ? rates_path : ""),
                             args);
    s.balancers.push_back(b);
  }
  const std::string pingpong = args.get("--pingpong", "both");
  if (pingpong != "on" && pingpong != "off" && pingpong != "both") {
    throw UsageError("--pingpong: expected on, off or both, got '" + pingpong + "'");
  }
  const std::string dist = args.get("--dist", "");
  s.lengths = cad::workload::load_lengths(dist);  // a regular file of at most 32 MiB (doc_lengths.h)

  sim::SystemCalibration cal = sim::load_system_calibration(args.get("--system", default_calibration("h200_system.json")));
  set_network(cal, args);
  if (args.has("--gemm-tflops")) {
    cal.gemm_tflops = parse_rate("--gemm-tflops", args.get("--gemm-tflops", ""));
    cal.gemm_source = "--gemm-tflops " + args.get("--gemm-tflops", "");
  }
  std::unique_ptr<sim::AttentionRates> rates;
  if (args.has("--attention-tflops")) {
    const std::vector<std::string> fb = split(args.get("--attention-tflops", ""), ',');
    if (fb.size() != 2) throw UsageError("--attention-tflops: expected FWD,BWD, e.g. 650,470");
    rates = sim::constant_rates(parse_rate("--attention-tflops", fb[0]), parse_rate("--attention-tflops", fb[1]), 2.5);
  } else {
    rates = sim::load_attention_rates(rates_path);
  }

  std::unique_ptr<sim::TrainerCalibration> trainer;
  if (args.has("--trainer")) {
    trainer = std::make_unique<sim::TrainerCalibration>(sim::load_trainer_calibration(args.get("--trainer", "")));
    if (s.layout.pp != 1 && !trainer_pipeline) {
      throw UsageError("--trainer models a data-parallel trainer (FSDP2); with --pp it needs --schedule gpipe "
                       "or 1f1b_ticks (the pipeline trainer)");
    }
    const std::string ck = args.get("--checkpointing", "full");
    if (ck != "full" && ck != "none") throw UsageError("--checkpointing: expected full or none, got '" + ck + "'");
    const std::string kernel = args.get("--kernel", "ours");
    if (kernel != "ours" && kernel != "torch_varlen") {
      throw UsageError("--kernel: expected ours or torch_varlen, got '" + kernel + "'");
    }
    s.trainer = trainer.get();
    s.trainer_options.checkpointing = ck == "full";
    if (s.pool == sim::PipelinePool::kBubble && s.schedule == sim::Schedule::k1f1bTicks &&
        !s.trainer_options.checkpointing) {
      throw UsageError(sim::kBubble1f1bNeedsCheckpointing);
    }
    if (s.pool == sim::PipelinePool::kBubbleStage && s.schedule != sim::Schedule::kGpipe) {
      throw UsageError(sim::kBubbleStageNeedsGpipe);
    }
    s.trainer_options.kernel_scale =
        kernel == "ours" ? trainer->attention_scale : trainer->torch_varlen_attention_scale;
  } else {
    for (const char* option : {"--checkpointing", "--kernel"}) {
      if (args.has(option)) throw UsageError(std::string(option) + " needs --trainer FILE (the trainer's calibration)");
    }
    if (trainer_pipeline) {
      throw UsageError("--schedule " + schedule + " prices the pipeline trainer's ticks with the trainer "
                       "calibration; it needs --trainer FILE (e.g. docs/simulate/trainer_h200.json)");
    }
  }
  const bool json = args.has("--json");
  if (args.has("--detail") && !json) throw UsageError("--detail needs --json");
  s.detail = args.has("--detail");
  const auto start = std::chrono::steady_clock::now();
  if (!args.has("--quiet")) {
    const int64_t units = s.steps * (s.layout.pp > 1 ? 1 : s.microbatches) * static_cast<int64_t>(s.balancers.size());
    // Plans of 128+ ranks take up to tens of ms each: say up front when the run is long (a minute or more).
    if (s.layout.dp() >= 128 && units >= 1000) {
      std::fprintf(stderr, "cad simulate: %lld plans of %lld ranks; this takes about a minute or more (the expected "
                   "time follows on each line; --quiet hides them)\n", static_cast<long long>(units),
                   static_cast<long long>(s.layout.dp()));
    }
    s.progress = progress_printer(s.layout.dp() >= 128, units);
  }
  sim::BatchSummary summary;
  const std::vector<sim::BalancerResult> results = sim::simulate(s, cal, *rates, &summary);
  require_finite(results);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const SimulateRun run{s,        cal,      *rates, trainer.get(), results, summary, dist, schedule, pingpong,
                        args.has("--balance-time"), has_tolerance, tolerance, wall};
  if (json) {
    std::printf("%s\n", report_json(run).dump(2).c_str());
  } else {
    print_report(run);
  }
  return 0;
}

}  // namespace

CAD_REGISTER_COMMAND(simulate, "simulate",
                     "predicted step time of CAD and its baselines at 8-1024+ GPUs from measured parts", run_simulate);
