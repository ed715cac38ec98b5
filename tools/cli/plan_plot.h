// plan_plot.h -- `cad plan --plot OUT`: draws the report with matplotlib (cli/plot_plan.py). The report
// goes to the script as a JSON file and OUT as one argv entry, with no shell in between: a file name
// is never read as a command (it once was spliced into a gnuplot script, where '|id' ran `id`).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace cad::cli {

// Runs `python3 plot_plan.py --out=OUT REPORT.json`, then prints "cad plan: plot written to OUT" on
// stderr. Throws std::runtime_error saying what is missing (python3, matplotlib, the script) or that
// drawing failed (the script's own message is on stderr).
void plot_plan(const nlohmann::json& report, const std::string& out);

}  // namespace cad::cli
