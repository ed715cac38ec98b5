// ping_pong_bench.cu -- does the ping-pong schedule hide CAD's communication on one GPU? (benchmark)
//
// mpirun -np 1 ping_pong_bench [--tokens 32768] [--layers 4] [--linear-us 800] [--reps 5]
// Two nano-batches of Pretrain-recipe documents, each with its own CAD plan (nccl communicator with one
// rank: every exchange is a real NCCL all_to_all_v, to self), and a stand-in for the linear layers (a
// kernel keeping every SM busy for --linear-us before and after attention). Reported, medians of --reps:
//   serial     A then B on one stream (nothing can overlap);
//   ping-pong  cad::run_ping_pong on two streams;
//   exchange   CAD forward minus the cuda backend alone on the same documents: the communication and
//              packing a layer adds (what ping-pong can hide);
// and, from CUDA event timestamps of one ping-pong layer, A's attention interval against B's compute.
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "batch_recipe.h"
#include "cad/cad_host.hpp"
#include "cad/ping_pong.hpp"
#include "doc_lengths.h"

namespace {

__global__ void busy(long long cycles, float* sink) {
  const long long start = clock64();
  float x = threadIdx.x;
  while (clock64() - start < cycles) x = x * 1.0000001f + 1e-7f;
  if (x == -1.f) sink[0] = x;  // never true: keeps the loop
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "ping_pong_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Nano {
  std::vector<cad_piece_v1_t> pieces;
  std::vector<cad_segment_v1_t> segments;  // for the cuda backend alone
  int64_t tokens = 0;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  std::vector<int64_t> qs, ks, ls;
  cad_tensor_v1_t tq{}, tk{}, tv{}, to{}, tl{};
  void* plan = nullptr;
};

cad_tensor_v1_t view(void* p, std::vector<int64_t>& shape, bool bf16) {
  return cad_tensor_v1_t{p, {CAD_DEVICE_CUDA, 0}, static_cast<int32_t>(shape.size()),
                         bf16 ? cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1} : cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1},
                         shape.data(), nullptr, 0};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int64_t tokens = 32768;
  int layers = 4, reps = 5;
  double linear_us = 800;
  std::string dist = "../shared/data/doclen_pretrain.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help") {
      std::printf("usage: mpirun -np 1 ping_pong_bench [--tokens N] [--layers L] [--linear-us US] [--reps R] [--dist F]\n");
      return 0;
    }
    if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); return 2; }
    const std::string v = argv[++i];
    if (a == "--tokens") tokens = std::stoll(v);
    else if (a == "--layers") layers = std::stoi(v);
    else if (a == "--linear-us") linear_us = std::stod(v);
    else if (a == "--reps") reps = std::stoi(v);
    else if (a == "--dist") dist = v;
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  const int hq = 32, hkv = 8, d = 128;
  const std::string config = nlohmann::json{
      {"log_level", "warn"},
      {"instances",
       {{{"name", "comm"}, {"plugin", "nccl"}, {"config", {{"bootstrap", "mpi"}}}},
        {{"name", "server"}, {"plugin", "cuda"}, {"config", nlohmann::json::object()}},
        {{"name", "bal"}, {"plugin", "prefix_aware"}, {"config", nlohmann::json::object()}},
        {{"name", "cad"}, {"plugin", "cad"},
         {"config", {{"communicator", "comm"}, {"balancer", "bal"}, {"server_backend", "server"},
                     {"keep_forward_tensors", false}}}}}}}.dump();
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_json = config.c_str();
  cad::Host host(options);
  const auto [cad_api, cad_ctx] = host.find<cad_attention_v1_t>("cad", CAD_PLUGIN_KIND_ATTENTION);
  const auto [cuda_api, cuda_ctx] = host.find<cad_attention_v1_t>("server", CAD_PLUGIN_KIND_ATTENTION);

  const std::vector<int64_t> lengths = cad::workload::load_lengths(dist);
  cudaStream_t streams[2];
  for (auto& s : streams) check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Nano nano[2];
  std::mt19937 rng(7);
  for (int n = 0; n < 2; ++n) {
    Nano& b = nano[n];
    b.pieces = cad::workload::sample_batch(lengths, tokens, 1, 11 + static_cast<uint64_t>(n))[0];
    for (const auto& p : b.pieces) {
      b.segments.push_back({b.tokens, p.len, b.tokens, p.len});
      b.tokens += p.len;
    }
    b.qs = {b.tokens, hq, d}, b.ks = {b.tokens, hkv, d}, b.ls = {hq, b.tokens};
    const size_t qb = static_cast<size_t>(b.tokens) * hq * d * 2, kb = static_cast<size_t>(b.tokens) * hkv * d * 2;
    check(cudaMalloc(&b.q, qb), "malloc"), check(cudaMalloc(&b.k, kb), "malloc"), check(cudaMalloc(&b.v, kb), "malloc");
    check(cudaMalloc(&b.o, qb), "malloc"), check(cudaMalloc(&b.lse, static_cast<size_t>(b.tokens) * hq * 4), "malloc");
    std::vector<uint16_t> fill(qb / 2);
    for (auto& x : fill) x = static_cast<uint16_t>(0x3c00 + rng() % 512);
    check(cudaMemcpy(b.q, fill.data(), qb, cudaMemcpyHostToDevice), "fill");
    check(cudaMemcpy(b.k, fill.data(), kb, cudaMemcpyHostToDevice), "fill");
    check(cudaMemcpy(b.v, fill.data() + kb / 4, kb, cudaMemcpyHostToDevice), "fill");
    b.tq = view(b.q, b.qs, true), b.tk = view(b.k, b.ks, true), b.tv = view(b.v, b.ks, true);
    b.to = view(b.o, b.qs, true), b.tl = view(b.lse, b.ls, false);
    cad_attention_plan_args_v1_t pa{};
    pa.struct_size = sizeof pa;
    pa.pieces = b.pieces.data();
    pa.num_pieces = static_cast<int64_t>(b.pieces.size());
    pa.num_q_heads = hq, pa.num_kv_heads = hkv, pa.head_dim = d;
    pa.dtype = {CAD_DTYPE_CODE_BFLOAT, 16, 1};
    pa.causal = 1;
    pa.device = {CAD_DEVICE_CUDA, 0};
    pa.stream = streams[n];
    if (cad_api->make_plan(cad_ctx, &pa, &b.plan) != CAD_STATUS_OK) {
      std::fprintf(stderr, "make_plan: %s\n", cad_api->last_error(cad_ctx));
      return 1;
    }
  }
  float* sink = nullptr;
  check(cudaMalloc(&sink, 4), "malloc");
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const long long cycles = static_cast<long long>(linear_us * clock_khz / 1000.0);
  auto linear = [&](int, int, void* s) { busy<<<sms, 128, 0, static_cast<cudaStream_t>(s)>>>(cycles, sink); };
  auto cad_forward = [&](int n, int, void* s) {
    cad_attention_forward_args_v1_t a{};
    a.struct_size = sizeof a;
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
    a.causal = 1;
    a.stream = s;
    a.q = &nano[n].tq, a.k = &nano[n].tk, a.v = &nano[n].tv, a.o = &nano[n].to, a.lse = &nano[n].tl;
    a.plan = nano[n].plan;
    if (cad_api->forward(cad_ctx, &a) != CAD_STATUS_OK) {
      std::fprintf(stderr, "forward: %s\n", cad_api->last_error(cad_ctx));
      std::exit(1);
    }
  };
  auto local_forward = [&](int n, int, void* s) {
    cad_attention_forward_args_v1_t a{};
    a.struct_size = sizeof a;
    a.segments = nano[n].segments.data();
    a.num_segments = static_cast<int64_t>(nano[n].segments.size());
    a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
    a.causal = 1;
    a.stream = s;
    a.q = &nano[n].tq, a.k = &nano[n].tk, a.v = &nano[n].tv, a.o = &nano[n].to, a.lse = &nano[n].tl;
    if (cuda_api->forward(cuda_ctx, &a) != CAD_STATUS_OK) std::exit(1);
  };
  cudaEvent_t t0, t1, join;
  check(cudaEventCreate(&t0), "event"), check(cudaEventCreate(&t1), "event");
  check(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "event");
  // Median GPU time of `body`, which enqueues on streams[0] (and streams[1], joined back).
  auto timed = [&](auto&& body) {
    std::vector<float> ms;
    for (int r = 0; r <= reps; ++r) {
      check(cudaDeviceSynchronize(), "sync");
      cudaEventRecord(t0, streams[0]);
      cudaStreamWaitEvent(streams[1], t0, 0);
      body();
      cudaEventRecord(join, streams[1]);
      cudaStreamWaitEvent(streams[0], join, 0);
      cudaEventRecord(t1, streams[0]);
      check(cudaEventSynchronize(t1), "sync");
      float t = 0;
      cudaEventElapsedTime(&t, t0, t1);
      if (r > 0) ms.push_back(t);  // the first is a warm-up
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  void* s0 = streams[0];
  const double cad_ms = timed([&] { for (int n = 0; n < 2; ++n) cad_forward(n, 0, s0); }) / 2;
  const double local_ms = timed([&] { for (int n = 0; n < 2; ++n) local_forward(n, 0, s0); }) / 2;
  const double linear_ms = timed([&] { linear(0, 0, s0); });
  const double serial_ms = timed([&] {
    for (int l = 0; l < layers; ++l) {
      for (int n = 0; n < 2; ++n) linear(n, l, s0), cad_forward(n, l, s0), linear(n, l, s0);
    }
  });
  const cad::NanoBatchCallbacks cb{linear, cad_forward, linear};
  const double pp_ms = timed([&] { cad::run_ping_pong(layers, cb, streams[0], streams[1]); });
  // One layer with timestamps: A's attention against B's compute before attention.
  cudaEvent_t ev[6];
  for (auto& e : ev) cudaEventCreate(&e);
  check(cudaDeviceSynchronize(), "sync");
  cudaEventRecord(ev[0], streams[0]);
  cudaStreamWaitEvent(streams[1], ev[0], 0);
  const cad::NanoBatchCallbacks marked{
      [&](int n, int l, void* s) { if (n == 1) cudaEventRecord(ev[3], static_cast<cudaStream_t>(s)); linear(n, l, s);
                                   if (n == 1) cudaEventRecord(ev[4], static_cast<cudaStream_t>(s)); },
      [&](int n, int l, void* s) { if (n == 0) cudaEventRecord(ev[1], static_cast<cudaStream_t>(s)); cad_forward(n, l, s);
                                   if (n == 0) cudaEventRecord(ev[2], static_cast<cudaStream_t>(s)); },
      linear};
  cad::run_ping_pong(1, marked, streams[0], streams[1]);
  cudaEventRecord(ev[5], streams[1]);
  check(cudaDeviceSynchronize(), "sync");
  float at[6] = {0};
  for (int i = 1; i < 6; ++i) cudaEventElapsedTime(&at[i], ev[0], ev[i]);

  const double exchange_ms = std::max(0.0, cad_ms - local_ms);
  const double hidden_ms = std::max(0.0, serial_ms - pp_ms);
  const double exposed_total = 2.0 * layers * exchange_ms;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU %s; 2 nano-batches x %lld tokens (%zu + %zu documents), %d layers, Hq=%d Hkv=%d D=%d bf16 causal; "
              "medians of %d\n", prop.name, static_cast<long long>(tokens), nano[0].pieces.size(), nano[1].pieces.size(),
              layers, hq, hkv, d, reps);
  std::printf("per nano-batch and layer: CAD forward %.3f ms, cuda backend alone %.3f ms -> exchange + packing %.3f ms; "
              "linear stand-in %.3f ms (x2 per layer)\n", cad_ms, local_ms, exchange_ms, linear_ms);
  std::printf("%d layers: serial %.3f ms, ping-pong %.3f ms; saved %.3f ms of %.3f ms of exchange (%.0f%% hidden)\n",
              layers, serial_ms, pp_ms, hidden_ms, exposed_total,
              exposed_total > 0 ? 100.0 * std::min(1.0, hidden_ms / exposed_total) : 0.0);
  std::printf("one ping-pong layer, ms from its start: A attention [%.3f, %.3f]; B compute before attention [%.3f, %.3f]; "
              "end %.3f\n", at[1], at[2], at[3], at[4], at[5]);
  for (auto& n : nano) cad_api->release_plan(cad_ctx, n.plan);
  MPI_Finalize();
  return 0;
}
