// server_check.cpp -- how well `cad simulate`'s attention model predicts CAD's measured server batches.
// bench/cad/cad_server_bench.cpp timed, on one H200, each rank's server batch (forward and backward) for
// Pretrain-recipe batches of 4/8 ranks x 64K/128K tokens and every balancer
// (bench/results/cad_server_bench_h200/cad_server_bench_h200.json). This tool rebuilds the same batches (tools/workload
// sample_batch, same seed) and plans (the same balancer plugins, through the ABI, with the same cost
// parameters and configs), checks that CAD's layout of each rank's server batch has the rows and segment
// count the benchmark recorded, and prices every rank two ways:
//  - "tasks": as the simulator does (plan_work.cpp rank_work: one shard per task, q = q_end - q_begin,
//    kv = q_end);
//  - "segments": the segments the GPU ran (plugins/cad/layout.h: a task held by several pieces is one
//    segment per piece; K/V rows are shared per document, which changes no segment's FLOPs).
// Both sum, per shard, FLOPs / the rate table's interpolated rate (the backward by tile pairs when the
// table has "backward_tiles": RateTable::bwd_seconds). Prints predicted/measured per rank
// (min/median/max) and the predicted vs measured max/mean. A benchmark check, not a test.
//
// usage: cad_simulate_server_check [--bench FILE] [--rates FILE] [--dist FILE] [--path PLUGIN_DIRS]
//                                  [--shards tasks|segments] [--per-rank] [--plan-rates FILE]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../plugins/cad/layout.h"  // CAD's layout; the simulator has its own layout.h (the parallel layout)
#include "attention_rates.h"
#include "balancer_runner.h"
#include "batch_recipe.h"
#include "doc_lengths.h"
#include "plan_work.h"
#include "check_support.h"
#include "step_model.h"
#include "tile_features.h"

namespace {

namespace sim = cad::simulate;
namespace check = cad::simulate::check;
using check::max_over_mean;
using check::Ratios;
using check::read_text;
using check::spread;

constexpr int64_t kH200Sms = 132;  // the benchmark's GPU: the forward schedule deals units to this many blocks

// One row of --per-rank: what was measured and predicted, and what the server batch is made of.
std::string rank_row(const std::string& label, int32_t rank, double meas_f, double meas_b, double pred_f,
                     double pred_b, const cad::cad_plugin::ServerBatch& batch, int64_t heads, int64_t group,
                     int64_t head_dim) {
  char row[160];
  std::snprintf(row, sizeof row, "| %s | %d | %.3f | %.3f | %.3f | %.3f | ", label.c_str(), rank, meas_f, meas_b,
                pred_f, pred_b);
  return row + check::feature_cells(batch.segments, batch.q_rows, batch.kv_rows, heads, group, head_dim, kH200Sms) +
         "\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string bench = "bench/results/cad_server_bench_h200/cad_server_bench_h200.json", rates_path = "configs/calibration/h200.json",
              dist = "/work/shared/data/doclen_pretrain.json", path, mode = "tasks", plan_rates;
  bool per_rank = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: cad_simulate_server_check [--bench FILE] [--rates FILE] [--dist FILE] [--path PLUGIN_DIRS]\n"
          "                                 [--shards tasks|segments] [--per-rank] [--plan-rates FILE]\n"
          "Rebuilds the batches and plans of cad_server_bench's JSON (--bench, default %s), predicts each\n"
          "rank's server forward/backward time with the simulator's attention model and the rate table\n"
          "(--rates, default %s), and prints predicted/measured per case. --shards tasks prices the plan's\n"
          "tasks as `cad simulate` does; segments prices CAD's layout segments the GPU ran. --per-rank adds,\n"
          "after the summary, one row per rank: measured and predicted ms and the server batch's features\n"
          "(segments, rows, forward GFLOPs, FLOP shares of segments with q <= 128 / <= 1024 and of the largest,\n"
          "128-query tiles, forward full/partial tile pairs, backward key tiles and full/partial pairs).\n"
          "--plan-rates: the table prefix_aware_time cases were PLANNED with (default: --rates), so that a\n"
          "new table (e.g. one with \"backward_tiles\") can price the plans the GPU ran with an older one.\n",
          bench.c_str(), rates_path.c_str());
      return 0;
    }
    if (a == "--per-rank") {
      per_rank = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cad_simulate_server_check: option %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--bench") bench = v;
    else if (a == "--rates") rates_path = v;
    else if (a == "--plan-rates") plan_rates = v;
    else if (a == "--dist") dist = v;
    else if (a == "--path") path = v;
    else if (a == "--shards" && (v == "tasks" || v == "segments")) mode = v;
    else {
      std::fprintf(stderr, "cad_simulate_server_check: unknown option or value %s %s (see --help)\n", a.c_str(),
                   v.c_str());
      return 2;
    }
  }
  if (plan_rates.empty()) plan_rates = rates_path;
  try {
    const auto rates = sim::load_attention_rates(rates_path);
    const nlohmann::json doc = nlohmann::json::parse(read_text(bench));
    const std::vector<int64_t> lengths = cad::workload::load_lengths(dist);
    cad::plan::ModelParams params;
    params.num_q_heads = doc.at("heads").get<int>();
    params.num_kv_heads = doc.at("kv_heads").get<int>();
    params.head_dim = doc.at("head_dim").get<int>();
    params.causal = true;
    cad_cost_params_v1_t cost{};
    cost.struct_size = sizeof cost;
    cost.num_q_heads = params.num_q_heads;
    cost.num_kv_heads = params.num_kv_heads;
    cost.head_dim = params.head_dim;
    cost.bytes_per_element = 2;
    cost.causal = 1;
    // Older files have one top-level "seed"; cad_server_bench now records each case's seed, and with
    // --lengths one given batch ("batch": "lengths FILE", packed in order into the ranks).
    const uint64_t file_seed = doc.contains("seed") ? doc.at("seed").get<uint64_t>() : 0;
    const std::string batch_text = doc.value("batch", std::string());
    const bool given_batch = batch_text.rfind("lengths ", 0) == 0;
    const std::vector<int64_t> given = given_batch ? cad::workload::load_lengths(batch_text.substr(8))
                                                   : std::vector<int64_t>();

    std::printf("shards priced: %s; rates: %s\n\n", mode.c_str(), rates->describe().c_str());
    std::printf("| ranks x tokens | balancer | fwd pred/meas min / median / max | bwd pred/meas min / median / max | "
                "fwd max/mean meas -> pred (error) | bwd max/mean meas -> pred (error) |\n");
    std::printf("|---|---|---|---|---|---|\n");
    std::vector<double> all_fwd, all_bwd;
    std::string rank_rows;  // --per-rank: printed after the summary table
    for (const auto& c : doc.at("cases")) {
      const auto ranks = c.at("ranks").get<int32_t>();
      const auto context = c.at("context").get<int64_t>();
      const auto name = c.at("balancer").get<std::string>();
      // prefix_aware_time is prefix_aware balancing predicted time with the rate table (cad_server_bench).
      const bool timed = name == "prefix_aware_time";
      // The time case's config as the bench recorded it ("time_config"); files from before it was recorded
      // (2026-11-26) ran prefix_aware_time without the gain guard, i.e. min_time_gain 0.
      nlohmann::json time_config = doc.contains("time_config") && doc.at("time_config").is_object()
                                       ? doc.at("time_config")
                                       : nlohmann::json{{"min_time_gain", 0}};
      time_config["rate_table"] = plan_rates;
      const std::string config = timed ? time_config.dump() : "{}";
      sim::BalancerRunner runner(timed ? "prefix_aware" : name, config, path);
      const uint64_t seed = c.contains("seed") ? c.at("seed").get<uint64_t>() : file_seed;
      const auto pieces = given_batch ? cad::workload::pack(given, context, ranks)
                                      : cad::workload::sample_batch(lengths, context, ranks, seed);
      const std::vector<cad_task_v1_t> tasks = runner.plan(pieces, cost);
      const cad::cad_plugin::Layout layout = cad::cad_plugin::build_layout(pieces, tasks, true);
      sim::Layout parallel;
      parallel.gpus = ranks;
      parallel.gpus_per_node = ranks;
      const std::vector<sim::RankWork> work = sim::rank_work(pieces, tasks, params, parallel, 0, *rates, nullptr);

      std::vector<double> meas_f, meas_b, pred_f, pred_b, ratio_f, ratio_b;
      for (int32_t r = 0; r < ranks; ++r) {
        const auto& m = c.at("ranks_detail").at(static_cast<size_t>(r));
        const auto& batch = layout.servers[static_cast<size_t>(r)];
        // The same server batch as the GPU ran, or the comparison means nothing.
        if (m.at("q_rows").get<int64_t>() != batch.q_rows || m.at("kv_rows").get<int64_t>() != batch.kv_rows ||
            m.at("segments").get<int64_t>() != static_cast<int64_t>(batch.segments.size())) {
          throw std::runtime_error(bench + ": " + std::to_string(ranks) + " x " + std::to_string(context) + " " +
                                   name + " rank " + std::to_string(r) +
                                   ": the rebuilt server batch differs from the measured one (q_rows/kv_rows/segments)");
        }
        const sim::AttentionSeconds seg = sim::attention_seconds(check::segment_shards(batch.segments),
                                                                 params.num_q_heads,
                                                                 params.head_dim, *rates);
        const sim::AttentionSeconds& task = work[static_cast<size_t>(r)].attention;
        // Same FLOPs either way: a task split over pieces is split into segments, never changed.
        if (std::abs(seg.fwd_flops - task.fwd_flops) > 1e-9 * task.fwd_flops) {
          throw std::runtime_error(name + " rank " + std::to_string(r) + ": segment FLOPs differ from task FLOPs");
        }
        const sim::AttentionSeconds& p = mode == "tasks" ? task : seg;
        meas_f.push_back(m.at("forward_ms").get<double>());
        meas_b.push_back(m.at("backward_ms").get<double>());
        pred_f.push_back(p.fwd * 1e3);
        pred_b.push_back(p.bwd * 1e3);
        ratio_f.push_back(pred_f.back() / meas_f.back());
        ratio_b.push_back(pred_b.back() / meas_b.back());
        all_fwd.push_back(ratio_f.back());
        all_bwd.push_back(ratio_b.back());
        if (per_rank) {
          const std::string label = std::to_string(ranks) + "x" + std::to_string(context / 1024) + "K " +
                                    (given_batch ? std::string("given") : "seed " + std::to_string(seed)) + " " + name;
          rank_rows += rank_row(label, r, meas_f.back(), meas_b.back(), pred_f.back(), pred_b.back(), batch,
                                params.num_q_heads, params.num_q_heads / params.num_kv_heads, params.head_dim);
        }
      }
      const Ratios f = spread(ratio_f), b = spread(ratio_b);
      const double mf = max_over_mean(meas_f), pf = max_over_mean(pred_f);
      const double mb = max_over_mean(meas_b), pb = max_over_mean(pred_b);
      std::printf("| %d x %lldK%s | %s | %.3f / %.3f / %.3f | %.3f / %.3f / %.3f | %.3f -> %.3f (%+.1f%%) | "
                  "%.3f -> %.3f (%+.1f%%) |\n",
                  ranks, static_cast<long long>(context / 1024),
                  given_batch ? " (given)" : (" seed " + std::to_string(seed)).c_str(), name.c_str(), f.min, f.median, f.max, b.min,
                  b.median, b.max, mf, pf, 100 * (pf / mf - 1), mb, pb, 100 * (pb / mb - 1));
    }
    const Ratios f = spread(all_fwd), b = spread(all_bwd);
    std::printf("\nall %zu rank batches: fwd pred/meas %.3f / %.3f / %.3f, bwd %.3f / %.3f / %.3f (min / median / max); "
                "within 10%%: fwd %td, bwd %td\n",
                all_fwd.size(), f.min, f.median, f.max, b.min, b.median, b.max, check::within_10_percent(all_fwd),
                check::within_10_percent(all_bwd));
    if (per_rank) {
      std::printf("\n| case | rank | fwd meas ms | bwd meas ms | fwd pred ms | bwd pred ms | %s |\n"
                  "|---|---|---|---|---|---|%s\n%s",
                  check::kFeatureHeader, check::feature_rule().c_str(), rank_rows.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad_simulate_server_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
