// cad_step_bench.cpp -- not a test: measures CAD steps on CPU under mpirun, one balancer after another,
// on batches sampled with the DistCA recipe from the shared document-length distribution.
//
//   mpirun -np 4 build/bin/cad_step_bench [--lengths FILE] [--context N] [--seed S] [--steps K]
//                                         [--heads H] [--kv-heads H] [--head-dim D] [--min-shard N]
//
// Rank 0 prints, per balancer: the cost model's max/mean server cost, the measured server compute CPU
// time (forward + backward; CPU time, so ranks sharing cores do not blur it) of the slowest and the mean
// rank, the slowest rank's whole step, and the bytes
// all ranks sent to other ranks. Timings are medians over K steps after one warm-up step.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "batch_recipe.h"
#include "cad/cad_host.hpp"
#include "doc_lengths.h"

namespace {

struct Options {
  std::string lengths = "/work/shared/data/doclen_pretrain.json";
  int64_t context = 4096;
  uint64_t seed = 1;
  int steps = 3;
  int64_t hq = 4, hkv = 2, d = 32;
  int64_t min_shard = 64;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--lengths") o.lengths = value;
    else if (key == "--context") o.context = std::stoll(value);
    else if (key == "--seed") o.seed = std::stoull(value);
    else if (key == "--steps") o.steps = std::stoi(value);
    else if (key == "--heads") o.hq = std::stoll(value);
    else if (key == "--kv-heads") o.hkv = std::stoll(value);
    else if (key == "--head-dim") o.d = std::stoll(value);
    else if (key == "--min-shard") o.min_shard = std::stoll(value);
    else throw std::invalid_argument("unknown option " + key);
  }
  return o;
}

cad_tensor_v1_t view(std::vector<float>& data, std::vector<int64_t>& shape) {
  return cad_tensor_v1_t{data.data(), {CAD_DEVICE_CPU, 0}, static_cast<int32_t>(shape.size()),
                         {CAD_DTYPE_CODE_FLOAT, 32, 1}, shape.data(), nullptr, 0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0, rank = 0, world = 1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  try {
    const Options opt = parse(argc, argv);
    const auto lengths = cad::workload::load_lengths(opt.lengths);
    const auto tables = cad::workload::sample_batch(lengths, opt.context, world, opt.seed);
    std::vector<cad_piece_v1_t> pieces = tables[static_cast<size_t>(rank)];
    int64_t tokens = 0;
    for (const auto& p : pieces) tokens += p.len;

    std::mt19937 rng(static_cast<unsigned>(opt.seed * 7919 + static_cast<uint64_t>(rank)));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const auto random = [&](int64_t n) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = dist(rng);
      return v;
    };
    std::vector<float> q = random(tokens * opt.hq * opt.d), k = random(tokens * opt.hkv * opt.d),
                       v = random(tokens * opt.hkv * opt.d), d_o = random(tokens * opt.hq * opt.d);
    std::vector<float> o(q.size()), lse(static_cast<size_t>(tokens * opt.hq)), d_q(q.size()), d_k(k.size()),
        d_v(v.size());
    std::vector<int64_t> q_shape = {tokens, opt.hq, opt.d}, kv_shape = {tokens, opt.hkv, opt.d},
                         lse_shape = {opt.hq, tokens};
    cad_tensor_v1_t tq = view(q, q_shape), tk = view(k, kv_shape), tv = view(v, kv_shape), to = view(o, q_shape),
                    tlse = view(lse, lse_shape), tdo = view(d_o, q_shape), tdq = view(d_q, q_shape),
                    tdk = view(d_k, kv_shape), tdv = view(d_v, kv_shape);

    std::vector<std::string> balancers;  // every balancer plugin the build has
    std::stringstream list(CAD_BENCH_BALANCERS);
    for (std::string name; std::getline(list, name, ',');) balancers.push_back(name);
    nlohmann::json instances = nlohmann::json::array();
    instances.push_back({{"name", "comm"}, {"plugin", "mpi"}, {"config", nlohmann::json::object()}});
    instances.push_back({{"name", "server"}, {"plugin", "reference"}, {"config", {{"num_threads", 1}}}});
    for (const auto& b : balancers) {
      instances.push_back({{"name", "bal_" + b}, {"plugin", b}, {"config", nlohmann::json::object()}});
      instances.push_back({{"name", "cad_" + b},
                           {"plugin", "cad"},
                           {"config",
                            {{"communicator", "comm"},
                             {"balancer", "bal_" + b},
                             {"server_backend", "server"},
                             {"min_shard_tokens", opt.min_shard}}}});
    }
    const std::string config = nlohmann::json{{"log_level", "warn"}, {"instances", instances}}.dump();
    cad_host_options_v1_t options{};
    options.struct_size = sizeof(options);
    options.config_json = config.c_str();
    cad::Host host(options);

    if (rank == 0) {
      std::printf("CAD step on CPU: %d ranks, context %lld tokens/rank, Hq=%lld Hkv=%lld D=%lld fp32, causal, "
                  "seed %llu, median of %d steps\n",
                  world, static_cast<long long>(opt.context), static_cast<long long>(opt.hq),
                  static_cast<long long>(opt.hkv), static_cast<long long>(opt.d),
                  static_cast<unsigned long long>(opt.seed), opt.steps);
      std::printf("%-13s %10s %14s %14s %12s %12s\n", "balancer", "model max/", "compute CPU ms", "compute CPU ms",
                  "step ms", "MB sent");
      std::printf("%-13s %10s %14s %14s %12s %12s\n", "", "mean cost", "slowest rank", "mean rank",
                  "slowest", "all ranks");
    }
    for (const auto& b : balancers) {
      const auto [table, ctx] = host.find<cad_attention_v1_t>("cad_" + b, CAD_PLUGIN_KIND_ATTENTION);
      std::vector<double> slowest_compute, mean_compute, slowest_step;
      double imbalance = 1.0, mbytes = 0.0;
      for (int step = 0; step <= opt.steps; ++step) {
        cad_attention_forward_args_v1_t fwd{};
        fwd.struct_size = sizeof(fwd);
        fwd.pieces = pieces.data();
        fwd.num_pieces = static_cast<int64_t>(pieces.size());
        fwd.softmax_scale = 1.0f / std::sqrt(static_cast<float>(opt.d));
        fwd.causal = 1;
        fwd.q = &tq;
        fwd.k = &tk;
        fwd.v = &tv;
        fwd.o = &to;
        fwd.lse = &tlse;
        cad_attention_backward_args_v1_t bwd{};
        bwd.struct_size = sizeof(bwd);
        bwd.pieces = fwd.pieces;
        bwd.num_pieces = fwd.num_pieces;
        bwd.softmax_scale = fwd.softmax_scale;
        bwd.causal = 1;
        bwd.q = &tq;
        bwd.k = &tk;
        bwd.v = &tv;
        bwd.o = &to;
        bwd.lse = &tlse;
        bwd.d_o = &tdo;
        bwd.d_q = &tdq;
        bwd.d_k = &tdk;
        bwd.d_v = &tdv;
        MPI_Barrier(MPI_COMM_WORLD);
        const double start = MPI_Wtime();
        if (table->forward(ctx, &fwd) != CAD_STATUS_OK || table->backward(ctx, &bwd) != CAD_STATUS_OK) {
          throw std::runtime_error(b + ": " + table->last_error(ctx));
        }
        const double step_ms = (MPI_Wtime() - start) * 1e3;
        size_t needed = 0;
        table->get_stats_json(ctx, nullptr, 0, &needed);
        std::string text(needed, '\0');
        table->get_stats_json(ctx, text.data(), text.size(), &needed);
        const auto stats = nlohmann::json::parse(text.c_str());
        const double compute = stats["forward"]["compute_cpu_ms"].get<double>() + stats["backward"]["compute_cpu_ms"].get<double>();
        double max_compute = 0, sum_compute = 0, max_step = 0;
        MPI_Allreduce(&compute, &max_compute, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&compute, &sum_compute, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&step_ms, &max_step, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (step == 0) continue;  // warm-up
        slowest_compute.push_back(max_compute);
        mean_compute.push_back(sum_compute / world);
        slowest_step.push_back(max_step);
        imbalance = stats["forward"]["imbalance"].get<double>();
        double sent = 0;
        for (const auto& x : stats["forward"]["bytes_sent_by_rank"]) sent += x.get<double>();
        for (const auto& x : stats["backward"]["bytes_sent_by_rank"]) sent += x.get<double>();
        mbytes = sent / 1e6;
      }
      if (rank == 0) {
        std::printf("%-13s %10.3f %14.1f %14.1f %12.1f %12.2f\n", b.c_str(), imbalance, median(slowest_compute),
                    median(mean_compute), median(slowest_step), mbytes);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] cad_step_bench: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
