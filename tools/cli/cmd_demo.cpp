// cmd_demo.cpp -- `cad demo`: the project's main job on CPU. With a CAD stack (configs/cad_cpu.json,
// under mpirun) it samples a Pretrain batch over the ranks, runs forward and backward through CAD with
// each balancer, prints per-rank cost, bytes and times, and exits non-zero unless every balancer gives
// the same results (demo_cad.h). With a local stack (configs/reference.json) it runs a random varlen
// batch through the attention instance (demo_local.h).
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli_args.h"
#include "command.h"
#include "demo_cad.h"
#include "demo_local.h"
#include "demo_stack.h"

namespace {

const char* kUsage =
    "usage: cad demo [--config FILE] [--path DIRS] [--seed S] [--heads H] [--kv-heads H] [--head-dim D]\n"
    "                [--noncausal] [--context N] [--dist FILE] [--balancers A,B,...] [--tokens N]\n\n"
    "Builds the stack of FILE (default configs/reference.json) and runs forward and backward through its\n"
    "attention instance (fp32, CPU).\n\n"
    "CAD stack (the attention instance's config names a balancer, as in configs/cad_cpu.json), under\n"
    "mpirun:  mpirun -np 4 cad demo --config configs/cad_cpu.json\n"
    "  (mpirun needs --oversubscribe with fewer cores than ranks and --allow-run-as-root as root; without\n"
    "  mpirun the demo runs one rank, which has nothing to balance, and says how to run it on several)\n"
    "  samples one batch with the DistCA recipe from the Pretrain document lengths, --context tokens per\n"
    "  rank, and runs it through CAD once per balancer: the same config with the balancer instance's\n"
    "  plugin swapped. Prints per rank its tokens, attention cost, bytes sent/received and server compute\n"
    "  time under each balancer; per balancer the max/mean cost imbalance, bytes moved and times; and\n"
    "  whether every balancer's O, LSE, dQ, dK, dV match the first's (max |diff| <= 1e-5 x max |value|).\n"
    "  Exits 1 on every rank if they do not.\n"
    "  --context N       tokens per rank (default 4096)\n"
    "  --dist FILE       document lengths, JSON list or one per line (default\n"
    "                    ../shared/data/doclen_pretrain.json beside the working directory or the source\n"
    "                    tree; if it is missing there, random documents are used instead and the demo\n"
    "                    says so; a FILE given here must exist)\n"
    "  --balancers LIST  balancer plugins to compare, the first being the baseline (default\n"
    "                    colocated,prefix_aware)\n"
    "  --inject-difference X  add X * max|O| to one value of the last balancer's O on rank 0 (tests that\n"
    "                    the check catches a difference)\n"
    "  Defaults: --heads 4 --kv-heads 2 --head-dim 32 (small, so the CPU reference server is quick).\n\n"
    "Local stack (e.g. configs/reference.json):\n"
    "  draws a few documents of random lengths summing to --tokens N (default 1024) and prints sizes,\n"
    "  timings and checksums. Under mpirun every rank runs the whole batch.\n"
    "  Defaults: --heads 8 --kv-heads 2 --head-dim 64.\n\n"
    "Both:\n"
    "  --seed S       random seed of the batch and the tensors (default 1)\n"
    "  --noncausal    full attention inside each document instead of causal\n"
    "  --path DIRS    directories searched for plugins first (colon-separated)\n";

std::vector<std::string> split_list(const std::string& text, const std::string& option) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) throw cad::cli::UsageError(option + ": empty name in '" + text + "'");
    items.push_back(item);
  }
  if (items.empty()) throw cad::cli::UsageError(option + ": expected a comma-separated list of plugin names");
  return items;
}

double parse_fraction(const std::string& text, const std::string& option) {
  try {
    size_t used = 0;
    const double x = std::stod(text, &used);
    if (used == text.size() && x >= 0) return x;
  } catch (const std::exception&) {
  }
  throw cad::cli::UsageError(option + ": expected a number >= 0, got '" + text + "'");
}

int run_demo(int argc, char** argv) {
  const cad::cli::Args args(argc, argv,
                            {"--config", "--tokens", "--heads", "--kv-heads", "--head-dim", "--seed", "--path",
                             "--context", "--dist", "--balancers", "--inject-difference"},
                            {"--noncausal"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.positional().empty()) throw cad::cli::UsageError("unexpected argument '" + args.positional()[0] + "'");
  // Every option is checked before anything is loaded, whichever mode the config selects.
  const std::string config = args.get("--config", cad::demo::default_config());
  const std::string search_path = args.get("--path", "");
  const uint64_t seed = static_cast<uint64_t>(args.get_int("--seed", 1, 0, INT64_MAX));
  const bool causal = !args.has("--noncausal");
  const int64_t tokens = args.get_int("--tokens", 1024, 1, int64_t{1} << 24);
  const int64_t context = args.get_int("--context", 4096, 1, int64_t{1} << 24);
  const int64_t heads_given = args.get_int("--heads", 0, 1, 1024);
  const int64_t kv_heads_given = args.get_int("--kv-heads", 0, 1, 1024);
  const int64_t head_dim_given = args.get_int("--head-dim", 0, 1, 1024);
  const std::vector<std::string> balancers = split_list(args.get("--balancers", "colocated,prefix_aware"), "--balancers");
  const double inject = parse_fraction(args.get("--inject-difference", "0"), "--inject-difference");

  const auto stack = cad::demo::read_cad_stack(config);
  // The mode's defaults for what was not given.
  const cad::demo::Shape defaults = stack ? cad::demo::Shape{4, 2, 32, causal} : cad::demo::Shape{8, 2, 64, causal};
  cad::demo::Shape shape = defaults;
  shape.heads = heads_given > 0 ? heads_given : defaults.heads;
  shape.kv_heads = kv_heads_given > 0 ? kv_heads_given : std::min(defaults.kv_heads, shape.heads);
  shape.head_dim = head_dim_given > 0 ? head_dim_given : defaults.head_dim;
  if (shape.kv_heads > shape.heads || shape.heads % shape.kv_heads != 0) {
    throw cad::cli::UsageError("--heads must be a multiple of --kv-heads");
  }

  if (!stack) {
    if (args.has("--context") || args.has("--dist") || args.has("--balancers") || args.has("--inject-difference")) {
      throw cad::cli::UsageError("--context, --dist, --balancers and --inject-difference need a CAD stack (the config's "
                                 "attention instance names a balancer), and " + config + " is not one");
    }
    cad::demo::LocalDemoOptions options;
    options.config = config;
    options.search_path = search_path;
    options.tokens = tokens;
    options.shape = shape;
    options.seed = seed;
    return cad::demo::run_local_demo(options);
  }
  if (args.has("--tokens")) {
    throw cad::cli::UsageError("--tokens is for local stacks; with a CAD stack give --context (tokens per rank)");
  }
  cad::demo::CadDemoOptions options;
  options.config = config;
  options.search_path = search_path;
  options.shape = shape;
  options.batch.dist = args.get("--dist", "");
  options.batch.context = context;
  options.batch.seed = seed;
  options.balancers = balancers;
  options.inject_difference = inject;
  return cad::demo::run_cad_demo(options, *stack);
}

}  // namespace

CAD_REGISTER_COMMAND(demo, "demo", "the main job: CAD forward and backward per balancer, checked (or a local stack's batch)",
                     run_demo);
