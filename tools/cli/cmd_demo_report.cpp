// cmd_demo_report.cpp -- see demo_report.h.
#include "demo_report.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <thread>

#include "demo_compare.h"

namespace cad::demo {
namespace {

constexpr size_t kTimesPerRun = 5;  // forward ms, backward ms, plan ms, compute CPU ms, compute wall ms
constexpr int kTextWidth = 108;     // the explanations are wrapped to this many columns

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }
double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}
double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}
double at_or_zero(const std::vector<double>& v, size_t i) { return i < v.size() ? v[i] : 0.0; }

// Max/mean attention cost (score entries) over servers: 1 is perfect balance.
double imbalance_of(const BalancerRun& run) {
  const double mean = mean_of(run.server_score_entries);
  return mean > 0 ? max_of(run.server_score_entries) / mean : 1.0;
}

// The slowest rank's server compute CPU time (forward + backward) under run b.
double slowest_compute(const std::vector<std::vector<double>>& times, size_t b) {
  double worst = 0;
  for (const auto& mine : times) worst = std::max(worst, mine[b * kTimesPerRun + 3]);
  return worst;
}

// The rank whose server compute took the most CPU time under run b.
size_t busiest_rank(const std::vector<std::vector<double>>& times, size_t b) {
  size_t busiest = 0;
  for (size_t r = 1; r < times.size(); ++r) {
    if (times[r][b * kTimesPerRun + 3] > times[busiest][b * kTimesPerRun + 3]) busiest = r;
  }
  return busiest;
}

// Server compute CPU time summed over the ranks under run b: the machine's work, wherever it runs.
double total_compute(const std::vector<std::vector<double>>& times, size_t b) {
  double sum = 0;
  for (const auto& mine : times) sum += mine[b * kTimesPerRun + 3];
  return sum;
}

// One column per balancer, wide enough for its name.
int column_width(const std::vector<BalancerRun>& runs) {
  size_t w = 12;
  for (const auto& run : runs) w = std::max(w, run.balancer.size() + 2);
  return static_cast<int>(w);
}

// printf into a string (the rows are built in pieces, then printed without trailing blanks).
void append(std::string& out, const char* format, ...) __attribute__((format(printf, 2, 3)));
void append(std::string& out, const char* format, ...) {
  char cell[256];
  va_list args;
  va_start(args, format);
  std::vsnprintf(cell, sizeof cell, format, args);
  va_end(args);
  out += cell;
}

void print_line(std::string line) {
  line.erase(line.find_last_not_of(' ') + 1);
  std::printf("%s\n", line.c_str());
}

// One explanation: `first` opens its first line, the text is wrapped at word boundaries to kTextWidth
// columns, and the lines after the first are indented by the width of `first`.
void print_paragraph(const std::string& first, const std::string& text) {
  const std::string indent(first.size(), ' ');
  std::string line = first;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(' ', begin);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(begin, end - begin);
    const bool fresh = line.size() == indent.size();  // nothing but the opening or the indent yet
    if (!fresh && line.size() + 1 + word.size() > static_cast<size_t>(kTextWidth)) {
      print_line(line);
      line = indent;
    }
    if (line.size() != indent.size()) line += ' ';
    line += word;
    begin = end + 1;
  }
  print_line(line);
}

std::string format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* format, ...) {
  std::string out;
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  out = text;
  return out;
}

void print_rank_table(const Batch& batch, const std::vector<BalancerRun>& runs,
                      const std::vector<std::vector<double>>& times) {
  const int w = column_width(runs);
  const int group = w * static_cast<int>(runs.size());
  std::string line;
  append(line, "\nper rank%13s  %-*s  %-*s  %-*s", "", group, "attention GFLOP (forward)", group,
         "MB sent/received (fwd+bwd)", group, "server compute CPU ms");
  print_line(line);
  line.clear();
  append(line, "%4s %8s %7s", "rank", "tokens", "pieces");
  for (int g = 0; g < 3; ++g) {
    line += "  ";
    for (const auto& run : runs) append(line, "%-*s", w, run.balancer.c_str());
  }
  print_line(line);
  for (size_t r = 0; r < batch.pieces.size(); ++r) {
    int64_t tokens = 0;
    for (const auto& p : batch.pieces[r]) tokens += p.len;
    line.clear();
    append(line, "%4zu %8lld %7zu  ", r, static_cast<long long>(tokens), batch.pieces[r].size());
    for (const auto& run : runs) append(line, "%-*.3f", w, at_or_zero(run.server_forward_flops, r) / 1e9);
    line += "  ";
    for (const auto& run : runs) {
      char cell[64];
      std::snprintf(cell, sizeof cell, "%.2f/%.2f", at_or_zero(run.bytes_sent_by_rank, r) / 1e6,
                    at_or_zero(run.bytes_received_by_rank, r) / 1e6);
      append(line, "%-*s", w, cell);
    }
    line += "  ";
    for (size_t b = 0; b < runs.size(); ++b) append(line, "%-*.1f", w, times[r][b * kTimesPerRun + 3]);
    print_line(line);
  }
}

void print_balancer_table(const std::vector<BalancerRun>& runs, const std::vector<std::vector<double>>& times) {
  const int w = column_width(runs);
  std::printf("\n%-*s %9s %10s %9s %8s %11s %11s %15s\n", w, "balancer", "max/mean", "max GFLOP", "MB moved",
              "plan ms", "forward ms", "backward ms", "compute CPU ms");
  std::printf("%-*s %9s %10s %9s %8s %11s %11s %15s\n", w, "", "cost", "(fwd)", "(fwd+bwd)", "(max)",
              "(slowest)", "(slowest)", "max / mean");
  for (size_t b = 0; b < runs.size(); ++b) {
    const BalancerRun& run = runs[b];
    std::vector<double> per_rank[kTimesPerRun];
    for (const auto& mine : times) {
      for (size_t k = 0; k < kTimesPerRun; ++k) per_rank[k].push_back(mine[b * kTimesPerRun + k]);
    }
    char compute[64];
    std::snprintf(compute, sizeof compute, "%.1f / %.1f", max_of(per_rank[3]), mean_of(per_rank[3]));
    std::printf("%-*s %9.3f %10.3f %9.2f %8.2f %11.1f %11.1f %15s\n", w, run.balancer.c_str(), imbalance_of(run),
                max_of(run.server_forward_flops) / 1e9, sum_of(run.bytes_sent_by_rank) / 1e6, max_of(per_rank[2]),
                max_of(per_rank[0]), max_of(per_rank[1]), compute);
  }
}

// What each balancer changes against the baseline, in one line.
void print_effects(const std::vector<BalancerRun>& runs, const std::vector<std::vector<double>>& times) {
  const BalancerRun& base = runs.front();
  std::printf("\n");
  for (size_t b = 1; b < runs.size(); ++b) {
    std::printf("%s -> %s: imbalance %.3f -> %.3f, slowest rank's server compute %.1f -> %.1f ms CPU, "
                "bytes moved %.2f -> %.2f MB\n",
                base.balancer.c_str(), runs[b].balancer.c_str(), imbalance_of(base), imbalance_of(runs[b]),
                slowest_compute(times, 0), slowest_compute(times, b), sum_of(base.bytes_sent_by_rank) / 1e6,
                sum_of(runs[b].bytes_sent_by_rank) / 1e6);
  }
}

void print_verdict(const std::vector<BalancerRun>& runs, const Verdict& verdict) {
  if (runs.size() < 2) {
    std::printf("\nresults agree: max rel diff 0 (only one balancer, %s: nothing to compare)\n",
                runs.front().balancer.c_str());
    return;
  }
  for (size_t b = 1; b < runs.size(); ++b) {
    std::printf("%s vs %s, max |diff| / max |value|:", runs[b].balancer.c_str(), runs.front().balancer.c_str());
    for (int i = 0; i < kNumOutputs; ++i) std::printf(" %s %.2e", kOutputNames[i], verdict.relative[b - 1][i]);
    std::printf("\n");
  }
  std::printf("results %s: max rel diff %.2e %s tolerance %.0e (fp32)\n", verdict.agree ? "agree" : "DISAGREE",
              verdict.worst, verdict.agree ? "<=" : "exceeds", kAgreementTolerance);
}

// What a newcomer should read from the tables, in words and with this run's numbers: the baseline against the
// last balancer. The times paragraph says why CAD can be slower than the baseline here although it balances:
// with more ranks than cores, a rank that finishes early waits without using the CPU (the MPI waits block) and
// the operating system runs the busy ranks on its core, so the wall time follows the work of all ranks
// together, which balance does not reduce; `cad demo` on 4 ranks and 2 cores shows the busiest colocated
// rank computing on more than its even share of the cores.
void print_reading(const std::vector<BalancerRun>& runs, const std::vector<std::vector<double>>& times,
                   const Verdict& verdict) {
  const BalancerRun& base = runs.front();
  const size_t last = runs.size() - 1;
  const BalancerRun& balanced = runs[last];
  const char* b0 = base.balancer.c_str();
  const char* b1 = balanced.balancer.c_str();
  std::printf("\nhow to read this (%s is the baseline%s):\n", b0,
              base.balancer == "colocated" ? ": every piece computed by its owner, as without CAD" : "");
  print_paragraph("- imbalance: ",
                  format("under %s the busiest rank has %.2fx the mean attention work (max/mean cost); %s brings "
                         "it to %.2fx (1 is perfect balance). With one GPU per rank the step waits for the busiest, "
                         "so this is the time balance can win.",
                         b0, imbalance_of(base), b1, imbalance_of(balanced)));
  print_paragraph("- bytes: ",
                  format("%s moved %.2f MB between the ranks (forward + backward: the Q/K/V rows of the shards "
                         "computed elsewhere, their outputs and gradients back) against %.2f MB under %s: what "
                         "the balance costs on the wire.",
                         b1, sum_of(balanced.bytes_sent_by_rank) / 1e6, sum_of(base.bytes_sent_by_rank) / 1e6, b0));
  print_paragraph("- agreement: ",
                  format("O, LSE, dQ, dK and dV under %s %s %s's to %.1e of their largest value (tolerance "
                         "%.0e, fp32)%s.",
                         b1, verdict.agree ? "equal" : "DIFFER FROM", b0, verdict.worst, kAgreementTolerance,
                         verdict.agree ? ": the plan changes where attention runs, not what it computes" : ""));
  const int ranks = static_cast<int>(times.size());
  const unsigned cores = std::thread::hardware_concurrency();
  const size_t busy = busiest_rank(times, 0);
  const double busy_cpu = times[busy][3], busy_wall = times[busy][4];
  if (cores > 0 && static_cast<unsigned>(ranks) > cores) {
    print_paragraph(
        "- times: ",
        format("%d ranks share %u CPU cores here, so a rank's wall time is not its own work: a rank that "
               "finishes early waits without using the CPU, and its core goes to the ranks still computing or to "
               "other programs (under %s the busiest rank, %zu, computed %.1f ms of CPU time in %.1f ms of wall "
               "time: %.2f cores, where an even share is %.2f). The wall times therefore follow the work of all "
               "ranks together (server compute CPU summed over the ranks: %s %.1f ms, %s %.1f ms), which balance "
               "does not reduce, plus CAD's exchanges and the other load on the cores: that is why %s's forward "
               "or backward can be slower than %s's here. With a core or a GPU per rank each rank's time is its "
               "own, and the slowest rank's compute (%.1f -> %.1f ms CPU here) is what sets the step.",
               ranks, cores, b0, busy, busy_cpu, busy_wall, busy_wall > 0 ? busy_cpu / busy_wall : 0.0,
               static_cast<double>(cores) / ranks, b0, total_compute(times, 0), b1, total_compute(times, last), b1,
               b0, slowest_compute(times, 0), slowest_compute(times, last)));
  } else {
    print_paragraph(
        "- times: ",
        format("%d ranks on %u CPU cores: each rank's wall time follows its own work (unless other programs share "
               "the cores), so the slowest rank's compute (%.1f -> %.1f ms CPU) is what balance shortens, and the "
               "exchanges of the bytes above are what it adds.",
               ranks, cores, slowest_compute(times, 0), slowest_compute(times, last)));
  }
}

// Where to go from here: one line for the GPU path, one for a trainer.
void print_next() {
  std::printf("\n");
  print_paragraph("next, on GPUs (CUDA kernels, NCCL): ",
                  "configure with -DCAD_ENABLE_CUDA=ON (CAD_ENABLE_CUDA=ON bash .ci/quickstart.sh demo builds it), "
                  "then bash tests/gpu_cad/run.sh");
  print_paragraph("next, in a PyTorch trainer: ",
                  "pip install the wheel (README), then torchrun --nproc-per-node 4 examples/train_llama.py "
                  "--attention cad --balancer prefix_aware --device cpu");
}

}  // namespace

int report(const Communicator& comm, const Batch& batch, const std::vector<BalancerRun>& runs) {
  std::vector<double> mine;
  for (const auto& run : runs) {
    mine.insert(mine.end(), {run.forward_ms, run.backward_ms, run.plan_ms, run.compute_cpu_ms, run.compute_ms});
  }
  const size_t times_size = mine.size();
  const std::vector<double> agreement = local_agreement(runs);
  mine.insert(mine.end(), agreement.begin(), agreement.end());

  const std::vector<double> all = comm.all_gather(mine);
  std::vector<std::vector<double>> times, agreements;
  for (int32_t r = 0; r < comm.world_size; ++r) {
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * mine.size());
    times.emplace_back(first, first + static_cast<std::ptrdiff_t>(times_size));
    agreements.emplace_back(first + static_cast<std::ptrdiff_t>(times_size),
                            first + static_cast<std::ptrdiff_t>(mine.size()));
  }
  const Verdict verdict = judge(agreements, runs.size(), kAgreementTolerance);
  if (comm.rank == 0) {
    print_rank_table(batch, runs, times);
    print_balancer_table(runs, times);
    print_effects(runs, times);
    print_verdict(runs, verdict);
    if (runs.size() > 1 && comm.world_size > 1) print_reading(runs, times, verdict);
    print_next();
    std::fflush(stdout);
  }
  return verdict.agree ? 0 : 1;
}

}  // namespace cad::demo
