// reference_timing.cpp -- times the reference plugin (the real .so, through its ABI) on one batch
// of causal documents and prints the plugin's own statistics. A tool, not a test: timings never
// decide pass/fail. Built on request only:
//   cmake --build BUILD --target reference_timing && BUILD/bin/reference_timing [doc_len docs hq hkv d threads]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "plugin_under_test.h"

int main(int argc, char** argv) {
  using namespace cad::testing;
  const auto arg = [&](int i, long fallback) { return argc > i ? std::atol(argv[i]) : fallback; };
  const int64_t doc_len = arg(1, 4096), docs = arg(2, 1), hq = arg(3, 8), hkv = arg(4, 2), d = arg(5, 128);
  const long threads = arg(6, 0);

  Problem p;
  p.tq = p.tk = doc_len * docs;
  p.hq = hq;
  p.hkv = hkv;
  p.d = d;
  p.causal = true;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int64_t i = 0; i < docs; ++i) p.segments.push_back({i * doc_len, doc_len, i * doc_len, doc_len});

  PluginUnderTest plugin(CAD_REFERENCE_PLUGIN_PATH);
  const std::string config = "{\"num_threads\": " + std::to_string(threads) + "}";
  Instance instance(plugin, config.c_str());
  if (!instance.ok()) {
    std::fprintf(stderr, "create failed: %s\n", instance.create_error().c_str());
    return 1;
  }
  AttentionTensors t(p, Dtype::F32, 1);
  const RunStatus status = run_forward_backward(instance, plugin.api(), p, t);
  if (status.forward != CAD_STATUS_OK || status.backward != CAD_STATUS_OK) {
    std::fprintf(stderr, "call failed: %s\n", instance.last_error());
    return 1;
  }
  char stats[256];
  size_t needed = 0;
  plugin.api()->get_stats_json(instance.ctx(), stats, sizeof(stats), &needed);
  // Causal score entries per head: L(L+1)/2 per document; forward = 4 * d FLOPs per entry.
  const double entries = static_cast<double>(docs) * doc_len * (doc_len + 1) / 2.0 * hq;
  std::printf("tokens %lld (docs %lld x %lld), hq %lld, hkv %lld, d %lld, threads %s: %s\n",
              static_cast<long long>(p.tq), static_cast<long long>(docs), static_cast<long long>(doc_len),
              static_cast<long long>(hq), static_cast<long long>(hkv), static_cast<long long>(d),
              threads == 0 ? "all" : std::to_string(threads).c_str(), stats);
  std::printf("forward work: %.2f GFLOP\n", entries * 4.0 * d / 1e9);
  return 0;
}
