// diet_check.cpp -- how well the rate table (configs/calibration/<gpu>.json, what the time-balancing cost
// model and `cad simulate` price shards with) predicts the kernels' measured time on CAD's real server
// batches: the 49 batches of bench/kernels/diet_batches.txt, timed by bench/kernels/diet_bench.py
// (bench/results/diet_bench_h200/diet_bench_h200.json). Each batch's segments are priced as the step model prices shards
// (FLOPs / the table's interpolated rate, summed) and compared with the measured time of every round at the
// table's head dim. Prints predicted/measured min / median / max, how many batches fall within 10%, and
// the batches predicted worst. A benchmark check, not a test.
//
// usage: cad_simulate_diet_check [--diet FILE] [--times FILE] [--rates FILE] [--worst N] [--per-batch]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention_rates.h"
#include "check_support.h"
#include "diet_batches.h"
#include "step_model.h"
#include "tile_features.h"

namespace {

namespace sim = cad::simulate;
namespace check = cad::simulate::check;

constexpr int64_t kH200Sms = 132;  // the measured GPU: the forward schedule deals units to this many blocks

struct Row {
  std::string name;
  int64_t segments = 0;
  double fwd_ratio = 0, bwd_ratio = 0;  // predicted / measured, median over rounds
  std::string per_batch;                 // --per-batch: the batch's row
};

}  // namespace

int main(int argc, char** argv) {
  std::string diet = "bench/kernels/diet_batches.txt", times = "bench/results/diet_bench_h200/diet_bench_h200.json",
              rates_path = "configs/calibration/h200.json";
  int worst = 8;
  bool per_batch = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: cad_simulate_diet_check [--diet FILE] [--times FILE] [--rates FILE] [--worst N] [--per-batch]\n"
          "Prices every server batch of the diet file (--diet, default %s) with the rate table (--rates,\n"
          "default %s) as the step model prices shards, and compares the prediction with the kernels'\n"
          "measured forward/backward time of each round at the table's head dim (--times: diet_bench.py's\n"
          "JSON, default %s). Prints predicted/measured min / median / max, the count within 10%%, and the\n"
          "N batches (--worst, default 8) furthest off. --per-batch adds one row per batch: measured and\n"
          "predicted ms (median over rounds) and the batch's features (see cad_simulate_server_check --help).\n",
          diet.c_str(), rates_path.c_str(), times.c_str());
      return 0;
    }
    if (a == "--per-batch") {
      per_batch = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "cad_simulate_diet_check: option %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--diet") diet = v;
    else if (a == "--times") times = v;
    else if (a == "--rates") rates_path = v;
    else if (a == "--worst") worst = std::max(0, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "cad_simulate_diet_check: unknown option %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  try {
    const auto rates = sim::load_attention_rates(rates_path);
    if (rates->head_dim() <= 0) throw std::runtime_error(rates_path + ": the table names no head dim");
    const std::string d = std::to_string(rates->head_dim());
    const nlohmann::json doc = nlohmann::json::parse(check::read_text(times));
    if (!doc.is_object() || !doc.contains("meta") || !doc.contains("rounds")) {
      throw std::runtime_error(times + ": not a diet_bench.py result (expected the keys 'meta' and 'rounds')");
    }
    const int64_t hq = doc.at("meta").at("hq").get<int64_t>();
    const std::vector<cad::diet::DietBatch> batches = cad::diet::read_diet_file(diet);

    std::vector<Row> rows;
    std::vector<double> fwd, bwd;
    for (const cad::diet::DietBatch& b : batches) {
      const sim::AttentionSeconds predicted =
          sim::attention_seconds(check::segment_shards(b.segments), hq, rates->head_dim(), *rates);
      std::vector<double> f, g, mf, mb;
      for (const nlohmann::json& round : doc.at("rounds")) {
        const nlohmann::json& at_d = round.at("head_dims");
        if (!at_d.contains(d) || !at_d.at(d).at("diet").contains(b.name)) continue;
        const nlohmann::json& m = at_d.at(d).at("diet").at(b.name);
        f.push_back(predicted.fwd * 1e3 / m.at("fwd_ms").get<double>());
        g.push_back(predicted.bwd * 1e3 / m.at("bwd_ms").get<double>());
        mf.push_back(m.at("fwd_ms").get<double>());
        mb.push_back(m.at("bwd_ms").get<double>());
      }
      if (f.empty()) continue;  // not measured (skipped, or cut by the run's deadline)
      rows.push_back({b.name, static_cast<int64_t>(b.segments.size()), check::spread(f).median,
                      check::spread(g).median, ""});
      if (per_batch) {
        char head[200];
        std::snprintf(head, sizeof head, "| %s | 0 | %.3f | %.3f | %.3f | %.3f | ", b.name.c_str(),
                      check::spread(mf).median, check::spread(mb).median, predicted.fwd * 1e3, predicted.bwd * 1e3);
        rows.back().per_batch = head +
                                check::feature_cells(b.segments, b.tq, b.tk, hq, hq / doc.at("meta").at("hkv").get<int64_t>(),
                                                     rates->head_dim(), kH200Sms) +
                                "\n";
      }
      fwd.push_back(rows.back().fwd_ratio);
      bwd.push_back(rows.back().bwd_ratio);
    }
    if (rows.empty()) throw std::runtime_error(times + ": no measured batch of " + diet + " at head dim " + d);
    const check::Ratios f = check::spread(fwd), g = check::spread(bwd);
    std::printf("rates: %s\nmeasured: %s (head dim %s, Hq %lld)\n\n", rates->describe().c_str(), times.c_str(),
                d.c_str(), static_cast<long long>(hq));
    std::printf("%zu batches, predicted / measured (median over rounds): fwd %.3f / %.3f / %.3f, bwd %.3f / %.3f / "
                "%.3f (min / median / max); within 10%%: fwd %td, bwd %td\n\n",
                rows.size(), f.min, f.median, f.max, g.min, g.median, g.max, check::within_10_percent(fwd),
                check::within_10_percent(bwd));
    if (per_batch) {
      std::printf("| batch | - | fwd meas ms | bwd meas ms | fwd pred ms | bwd pred ms | %s |\n|---|---|---|---|---|---|%s\n",
                  check::kFeatureHeader, check::feature_rule().c_str());
      for (const Row& r : rows) std::printf("%s", r.per_batch.c_str());
      std::printf("\n");
    }
    std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
      return std::max(std::abs(std::log(x.fwd_ratio)), std::abs(std::log(x.bwd_ratio))) >
             std::max(std::abs(std::log(y.fwd_ratio)), std::abs(std::log(y.bwd_ratio)));
    });
    std::printf("| batch | segments | fwd predicted / measured | bwd predicted / measured |\n|---|---|---|---|\n");
    for (int i = 0; i < worst && i < static_cast<int>(rows.size()); ++i) {
      std::printf("| %s | %lld | %.3f | %.3f |\n", rows[i].name.c_str(), static_cast<long long>(rows[i].segments),
                  rows[i].fwd_ratio, rows[i].bwd_ratio);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad_simulate_diet_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
