// plan_bench.cpp -- the planning benchmark (not a test). For each balancer plugin given on the command
// line, for each server count and context: sample a Pretrain-recipe batch, plan it through the ABI,
// and print the imbalance before/after, the bytes moved and the plan time (best of --repeat runs).
//
//   plan_bench --dist FILE --ranks 4,8,32,64 --context 65536,131072 [--seeds N] [--repeat N]
//              [--config-<name> JSON] PLUGIN.so...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "balancer_harness.h"
#include "batch_recipe.h"
#include "doc_lengths.h"

namespace {

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dist = "../shared/data/doclen_pretrain.json";  // the shared folder beside the checkout
  std::vector<int64_t> ranks_list = {4, 8, 32, 64}, contexts = {65536, 131072, 262144, 524288};
  int seeds = 1, repeat = 1;
  int64_t min_shard = 128;
  std::map<std::string, std::string> configs;
  std::vector<std::string> plugins;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: cad_plan_bench [--dist FILE] [--ranks 4,8,32,64] [--context 65536,...] [--seeds N] [--repeat N]\n"
          "                      [--min-shard N] [--config-<name> JSON] PLUGIN.so...\n"
          "Plans sampled Pretrain-recipe batches with each balancer plugin through the ABI and prints the\n"
          "imbalance before/after, the bytes moved and the plan time (best of --repeat). A benchmark, not a test.\n");
      return 0;
    }
    if (a.rfind("--", 0) == 0 && a != "--dist" && a != "--ranks" && a != "--context" && a != "--seeds" &&
        a != "--repeat" && a != "--min-shard" && a.rfind("--config-", 0) != 0) {
      std::fprintf(stderr, "cad_plan_bench: unknown option %s (see --help)\n", a.c_str());
      return 2;
    }
    if (a == "--dist") dist = next();
    else if (a == "--ranks") ranks_list = parse_list(next());
    else if (a == "--context") contexts = parse_list(next());
    else if (a == "--seeds") seeds = std::atoi(next().c_str());
    else if (a == "--repeat") repeat = std::atoi(next().c_str());
    else if (a == "--min-shard") min_shard = std::stoll(next());
    else if (a.rfind("--config-", 0) == 0) configs[a.substr(9)] = next();
    else plugins.push_back(a);
  }
  const auto lengths = cad::workload::load_lengths(dist);
  const auto cost = cad::balancer_test::cost_params(min_shard);
  const auto model = cad::plan::model_params(cost);
  std::printf("%-14s %6s %8s %5s %9s %9s %12s %10s %10s %10s\n", "balancer", "ranks", "context", "seed", "before",
              "after", "bytes_GiB", "q_rows", "kv_tokens", "plan_ms");
  for (const auto& path : plugins) {
    std::string name = path.substr(path.find_last_of('/') + 1);
    name = name.substr(4, name.size() - 7);  // cad_<name>.so
    cad::balancer_test::LoadedBalancer b(path, configs.count(name) ? configs[name] : "{}");
    for (int64_t r : ranks_list) {
      for (int64_t ctx : contexts) {
        for (int seed = 0; seed < seeds; ++seed) {
          const auto batch = cad::workload::sample_batch(lengths, ctx, static_cast<int32_t>(r), 1000 + seed);
          double best_ms = 1e30;
          cad::balancer_test::PlanResult res;
          for (int k = 0; k < repeat; ++k) {
            const auto t0 = std::chrono::steady_clock::now();
            res = b.plan(batch, static_cast<int32_t>(r), cost);
            const auto t1 = std::chrono::steady_clock::now();
            best_ms = std::min(best_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
          }
          if (res.status != CAD_STATUS_OK) {
            std::printf("%-14s %6lld %8lld %5d error: %s\n", name.c_str(), (long long)r, (long long)ctx, seed,
                        res.error.c_str());
            continue;
          }
          const auto st = cad::plan::evaluate_plan(batch, static_cast<int32_t>(r), res.tasks.data(),
                                                   static_cast<int64_t>(res.tasks.size()), model);
          const double before = cad::plan::imbalance_of(cad::plan::colocated_cost(batch, true));
          std::printf("%-14s %6lld %8lld %5d %9.3f %9.3f %12.3f %10lld %10lld %10.2f\n", name.c_str(), (long long)r,
                      (long long)ctx, seed, before, st.imbalance, st.total_bytes / 1073741824.0,
                      (long long)st.q_rows_moved, (long long)st.kv_tokens_moved, best_ms);
        }
      }
    }
  }
  return 0;
}
