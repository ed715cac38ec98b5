// measure_rate_table.cu -- cad_measure_rate_table: measures the kernel-rate table that the balancers and
// the simulator read (configs/calibration/<gpu>.json, schema in planning/rate_table.h) on the
// current GPU and writes it as JSON. Which shapes, which batch per shape and the JSON are rate_grid.h's
// (CPU, tested in tests/rate_grid); this file only times the batches, with case_timer.h's time_case (the
// timing that cad_kernel_bench and diet_bench.py use), and refuses to write a table it could not complete.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cad_kernels.h"
#include "case_timer.h"
#include "rate_grid.h"

namespace {

using cad::rates::GridSpec;
using cad::rates::Measurement;
using cad::rates::Shape;

const char* const kUsage =
    "usage: cad_measure_rate_table --out FILE [options]\n"
    "Times the project's attention kernels (forward and backward) on the current GPU for every (q, kv) cell of\n"
    "a grid and writes the kernel-rate table (planning/rate_table.h's schema) to FILE. Each cell is one\n"
    "batch of n identical causal shards, each the last q queries of its own document of kv tokens; n gives\n"
    "the batch about --target-gflop of forward work and at least --min-units forward units within the row\n"
    "caps. Cells with q > kv cannot occur for\n"
    "a causal shard: they copy the (kv, kv) shape, which is timed for them. FILE is written only when every\n"
    "shape was measured.\n"
    "options:\n"
    "  --out FILE             the table to write (through FILE.tmp, renamed when complete)\n"
    "  --q-lens LIST          query lengths, comma-separated, k = x1024 (default 32,128,512,2048,8192,32768)\n"
    "  --kv-lens LIST         KV lengths (default 256,1024,4096,16384,65536,131072)\n"
    "  --hq N, --hkv N        query / KV heads (default 32, 8)\n"
    "  --head-dim N           64 or 128 (default 128)\n"
    "  --target-gflop X       forward GFLOP per timed batch (default 400)\n"
    "  --min-units N          at least N forward units (128-query tiles x Hq) per batch (default 1056 = 8\n"
    "                         waves of 132 SMs; 0 = off)\n"
    "  --max-q-rows N         cap on n*q (default 131072)\n"
    "  --max-kv-rows N        cap on n*kv (default 1048576)\n"
    "  --dense-len N          the dense entry: causal documents of N tokens (default 16384)\n"
    "  --warmups N            calls before timing (default 2)\n"
    "  --reps N               timed calls, the median is kept (default 10)\n"
    "  --deadline SECONDS     stop before starting a shape once SECONDS have passed (a shape already\n"
    "                         running finishes), write nothing and exit 2 naming the shapes not measured\n"
    "  --source-tag TEXT      added to every source, e.g. \"$(git rev-parse --short HEAD) $(date -u +%F)\"\n"
    "  --dry-run              print the shapes and their batches, run nothing on the GPU, write nothing\n"
    "  --help                 this text\n"
    "exit status: 0 written, 1 error (bad flag, a shape that does not fit even as one shard, a CUDA error),\n"
    "2 deadline reached.\n";

struct Options {
  GridSpec spec;
  std::string out;
  int warmups = 2, reps = 10;
  double deadline_s = 0;  // 0: none
  std::string source_tag;
  bool dry_run = false;
  std::string command;
};

int64_t integer_flag(const std::string& flag, const std::string& text, int64_t min) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < min) {
    throw std::invalid_argument(flag + ": expected an integer >= " + std::to_string(min) + ", got '" + text + "'");
  }
  return v;
}

double number_flag(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !(v > 0) || !std::isfinite(v)) {
    throw std::invalid_argument(flag + ": expected a number > 0, got '" + text + "'");
  }
  return v;
}

// The command line as one string (arguments with spaces quoted), for the table's comment.
std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (!s.empty()) s += ' ';
    s += a.find_first_of(" \t\"'") == std::string::npos && !a.empty() ? a : "'" + a + "'";
  }
  return s;
}

// Fills `o` from the command line; false when --help asks for the usage instead.
bool parse_args(int argc, char** argv, Options& o) {
  o.command = command_line(argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return false;
    if (flag == "--dry-run") {
      o.dry_run = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + ": missing value (or unknown flag; see --help)");
    const std::string v = argv[++i];
    if (flag == "--out") {
      o.out = v;
    } else if (flag == "--q-lens") {
      o.spec.q_lens = cad::rates::parse_lengths(v, flag);
    } else if (flag == "--kv-lens") {
      o.spec.kv_lens = cad::rates::parse_lengths(v, flag);
    } else if (flag == "--hq") {
      o.spec.hq = static_cast<int32_t>(integer_flag(flag, v, 1));
    } else if (flag == "--hkv") {
      o.spec.hkv = static_cast<int32_t>(integer_flag(flag, v, 1));
    } else if (flag == "--head-dim") {
      o.spec.head_dim = static_cast<int32_t>(integer_flag(flag, v, 1));
    } else if (flag == "--target-gflop") {
      o.spec.target_gflop = number_flag(flag, v);
    } else if (flag == "--min-units") {
      o.spec.min_units = integer_flag(flag, v, 0);
    } else if (flag == "--max-q-rows") {
      o.spec.max_q_rows = integer_flag(flag, v, 1);
    } else if (flag == "--max-kv-rows") {
      o.spec.max_kv_rows = integer_flag(flag, v, 1);
    } else if (flag == "--dense-len") {
      o.spec.dense_len = integer_flag(flag, v, 1);
    } else if (flag == "--warmups") {
      o.warmups = static_cast<int>(integer_flag(flag, v, 0));
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(integer_flag(flag, v, 1));
    } else if (flag == "--deadline") {
      o.deadline_s = number_flag(flag, v);
    } else if (flag == "--source-tag") {
      o.source_tag = v;
    } else {
      throw std::invalid_argument("unknown flag " + flag + " (see --help)");
    }
  }
  cad::rates::validate(o.spec);
  if (!cad::kernels::head_dim_supported(o.spec.head_dim)) {
    throw std::invalid_argument("--head-dim: the kernels support 64 or 128, got " + std::to_string(o.spec.head_dim));
  }
  if (o.out.empty() && !o.dry_run) throw std::invalid_argument("--out FILE is required (see --help)");
  return true;
}

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

cad::bench::TimedCase timed_case_of(const cad::rates::ShardBatch& b, const GridSpec& spec) {
  cad::bench::TimedCase c;
  for (const cad_segment_v1_t& s : b.segments) c.segments.push_back({s.q_offset, s.q_len, s.kv_offset, s.kv_len});
  c.tq = b.tq;
  c.tk = b.tk;
  c.causal = true;
  c.hq = spec.hq;
  c.hkv = spec.hkv;
  c.head_dim = spec.head_dim;
  // The rates divide rate_grid's FLOP count (plan_model's) by the times; it must be case_timer's too.
  const double timer_flops = cad::bench::forward_flops(c);
  if (std::abs(timer_flops - b.forward_flops) > 1e-9 * b.forward_flops) {
    throw std::logic_error("shape " + cad::rates::to_string(b.shape) + ": case_timer counts " +
                           std::to_string(timer_flops) + " forward FLOPs, rate_grid " +
                           std::to_string(b.forward_flops));
  }
  return c;
}

// Times one shape, halving n while the batch does not fit in device memory.
Measurement time_shape(const Shape& shape, const Options& o, int num_sms, cudaStream_t stream) {
  cad::bench::TimingOptions t;
  t.warmups = o.warmups;
  t.reps = o.reps;
  for (int64_t n = cad::rates::shards_for(shape, o.spec);; n = std::max<int64_t>(n / 2, 1)) {
    const cad::rates::ShardBatch b = cad::rates::make_batch(shape, n, o.spec);
    try {
      const cad::bench::CaseTiming r = cad::bench::time_case(timed_case_of(b, o.spec), t, num_sms, stream);
      return cad::rates::measurement_of(b, r.fwd_ms, r.bwd_ms);
    } catch (const cad::bench::NotEnoughMemory& e) {
      if (n == 1) {
        throw std::runtime_error("shape " + cad::rates::to_string(shape) + ": one shard does not fit: " + e.what());
      }
      std::printf("  %s: %lld shards do not fit (%s); retrying with %lld\n", cad::rates::to_string(shape).c_str(),
                  static_cast<long long>(n), e.what(), static_cast<long long>(std::max<int64_t>(n / 2, 1)));
    }
  }
}

void print_plan(const std::vector<cad::rates::PlannedShape>& shapes, const GridSpec& spec) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i].shape;
    const int64_t n = cad::rates::shards_for(s, spec);
    const cad::rates::ShardBatch b = cad::rates::make_batch(s, n, spec);
    std::printf("[%zu/%zu] %s %s: %lld shard%s, tq %lld tk %lld, %.1f GFLOP forward\n", i + 1, shapes.size(),
                cad::rates::to_string(s).c_str(), shapes[i].role.c_str(), static_cast<long long>(n), n == 1 ? "" : "s",
                static_cast<long long>(b.tq), static_cast<long long>(b.tk), b.forward_flops / 1e9);
  }
  for (int64_t q : spec.q_lens) {
    for (int64_t kv : spec.kv_lens) {
      if (q > kv) {
        std::printf("cell (%lld, %lld): unreachable (q > kv), copies %s\n", static_cast<long long>(q),
                    static_cast<long long>(kv), cad::rates::to_string(cad::rates::timed_shape_of({q, kv})).c_str());
      }
    }
  }
}

// Writes `text` to `path` through path.tmp, so that a reader never sees a half-written table.
void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw std::runtime_error(tmp + ": cannot open for writing");
    f << text;
    f.flush();
    if (!f) throw std::runtime_error(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

int run(const Options& o) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const std::vector<cad::rates::PlannedShape> shapes = cad::rates::shapes_to_time(o.spec);
  if (o.dry_run) {
    print_plan(shapes, o.spec);
    return 0;
  }
  {  // Fail on an unwritable --out now, not after minutes of timing.
    std::ofstream probe(o.out + ".tmp", std::ios::trunc);
    if (!probe) throw std::runtime_error(o.out + ".tmp: cannot open for writing");
  }
  std::remove((o.out + ".tmp").c_str());

  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) throw std::runtime_error("no CUDA device");
  cad::rates::TableInfo info;
  info.gpu = prop.name;
  info.date = today_utc();
  info.source_tag = o.source_tag;
  info.command = o.command;
  info.kernels = std::string(cad::kernels::hopper_kernels_available() ? "wgmma (sm_90a)" : "mma.sync") + " kernels, " +
                 std::to_string(prop.multiProcessorCount) + " SMs";
  info.warmups = o.warmups;
  info.reps = o.reps;
  std::printf("device: %s (%s); %zu shapes to time\n", info.gpu.c_str(), info.kernels.c_str(), shapes.size());
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    throw std::runtime_error("cudaStreamCreateWithFlags failed");
  }

  std::map<Shape, Measurement> measured;
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (o.deadline_s > 0 && elapsed() >= o.deadline_s) break;
    const Shape& s = shapes[i].shape;
    const Measurement m = time_shape(s, o, prop.multiProcessorCount, stream);
    measured[s] = m;
    std::printf("[%zu/%zu] %s %s: %lld shard%s, tq %lld tk %lld: fwd %.4g ms %.1f TFLOP/s, bwd %.4g ms %.1f "
                "TFLOP/s (%.1f s)\n",
                i + 1, shapes.size(), cad::rates::to_string(s).c_str(), shapes[i].role.c_str(),
                static_cast<long long>(m.n), m.n == 1 ? "" : "s", static_cast<long long>(m.tq), static_cast<long long>(m.tk), m.fwd_ms,
                m.fwd_tflops(), m.bwd_ms, m.bwd_tflops(), elapsed());
    std::fflush(stdout);
  }
  cudaStreamDestroy(stream);

  const std::vector<Shape> missing = cad::rates::missing_shapes(o.spec, measured);
  if (!missing.empty()) {
    std::string list;
    for (const Shape& s : missing) list += (list.empty() ? "" : ", ") + cad::rates::to_string(s);
    std::fprintf(stderr,
                 "cad_measure_rate_table: --deadline %.0f s reached after %.1f s; %zu of %zu shapes not measured: "
                 "%s; %s not written\n",
                 o.deadline_s, elapsed(), missing.size(), shapes.size(), list.c_str(), o.out.c_str());
    return 2;
  }
  write_file(o.out, cad::rates::table_json(o.spec, measured, info));
  std::printf("wrote %s: %zu x %zu cells, %zu shapes timed in %.1f s\n", o.out.c_str(), o.spec.q_lens.size(),
              o.spec.kv_lens.size(), shapes.size(), elapsed());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o;
    if (!parse_args(argc, argv, o)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cad_measure_rate_table: %s\n", e.what());
    return 1;
  }
}
