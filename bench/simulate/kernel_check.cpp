// kernel_check.cpp -- how well the attention rate table predicts whole measured kernel batches: for each
// case of bench/kernels/kernel_bench.cu (kernel_cases.json: its shards and the TFLOP/s measured for it),
// the batch's predicted rate is its FLOPs over the sum of each shard's FLOPs / table rate -- exactly how
// `cad simulate` prices a server's batch. Prints predicted vs measured and the error. Not a test.
//
// usage: cad_simulate_kernel_check RATE_TABLE.json kernel_cases.json
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention_rates.h"
#include "step_model.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s RATE_TABLE.json kernel_cases.json\n", argv[0]);
    return 2;
  }
  try {
    const auto rates = cad::simulate::load_attention_rates(argv[1]);
    std::ifstream in(argv[2]);
    if (!in) throw std::runtime_error(std::string(argv[2]) + ": cannot open");
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json doc = nlohmann::json::parse(text.str());
    std::printf("| case | shards | measured fwd | predicted fwd | error | measured bwd | predicted bwd | error |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& c : doc.at("cases")) {
      std::vector<cad::simulate::Shard> shards;
      for (const auto& s : c.at("shards")) {
        const int64_t q = s.at(0).get<int64_t>(), kv = s.at(1).get<int64_t>();
        shards.push_back({q, kv, q * kv - q * (q - 1) / 2});
      }
      // One head of D = table head dim: the rate does not depend on the head count here.
      const int64_t d = rates->head_dim() > 0 ? rates->head_dim() : 128;
      const cad::simulate::AttentionSeconds t = cad::simulate::attention_seconds(shards, 1, d, *rates);
      const double fwd = t.fwd_flops / t.fwd / 1e12;
      const double bwd = t.fwd_flops * rates->backward_flop_ratio() / t.bwd / 1e12;
      const double mf = c.at("fwd_tflops").get<double>(), mb = c.at("bwd_tflops").get<double>();
      std::printf("| %s | %zu | %.0f | %.0f | %+.1f%% | %.0f | %.0f | %+.1f%% |\n", c.at("name").get<std::string>().c_str(),
                  shards.size(), mf, fwd, 100 * (fwd / mf - 1), mb, bwd, 100 * (bwd / mb - 1));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad_simulate_kernel_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
