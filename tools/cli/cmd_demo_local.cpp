// cmd_demo_local.cpp -- see demo_local.h.
#include "demo_local.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace cad::demo {
namespace {

// Document lengths: 1 to 8 documents, cut at random points, summing to `tokens`.
std::vector<int64_t> draw_documents(int64_t tokens, std::mt19937_64& rng) {
  const int64_t max_docs = std::min<int64_t>(8, tokens);
  const int64_t docs = std::uniform_int_distribution<int64_t>(1, max_docs)(rng);
  std::vector<int64_t> cuts;
  std::uniform_int_distribution<int64_t> position(1, tokens - 1);
  while (static_cast<int64_t>(cuts.size()) < docs - 1) {
    const int64_t c = position(rng);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(tokens);
  std::vector<int64_t> lengths;
  int64_t previous = 0;
  for (int64_t c : cuts) {
    lengths.push_back(c - previous);
    previous = c;
  }
  return lengths;
}

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937_64& rng) {
  Tensor t(std::move(shape));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : t.data) x = uniform(rng);
  return t;
}

}  // namespace

int run_local_demo(const LocalDemoOptions& options) {
  const Shape& shape = options.shape;
  const int64_t tokens = options.tokens, heads = shape.heads, kv_heads = shape.kv_heads, head_dim = shape.head_dim;
  cad::Host host(options.config, options.search_path.empty() ? nullptr : options.search_path.c_str());
  const auto [attention, instance] = host.attention();

  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof caps;
  require(attention->get_capabilities(instance, &caps), attention, instance, "get_capabilities");
  if (caps.device_type != CAD_DEVICE_CPU || (caps.dtype_mask & CAD_ATTENTION_DTYPE_FP32) == 0) {
    std::fprintf(stderr, "cad demo: the attention instance does not take fp32 CPU tensors (the demo's only mode so far)\n");
    return 1;
  }
  if ((caps.flags & CAD_ATTENTION_CAP_PIECES) != 0) {
    std::fprintf(stderr, "cad demo: the attention instance takes pieces, but the config names no balancer instance "
                         "for it (the CAD mode needs the CAD instance's \"balancer\" key)\n");
    return 1;
  }
  const uint32_t needed = static_cast<uint32_t>(shape.causal ? CAD_ATTENTION_CAP_CAUSAL : CAD_ATTENTION_CAP_NONCAUSAL) |
                          CAD_ATTENTION_CAP_BACKWARD |
                          (heads != kv_heads ? static_cast<uint32_t>(CAD_ATTENTION_CAP_GQA) : 0u);
  if ((caps.flags & needed) != needed) {
    std::fprintf(stderr, "cad demo: the attention instance lacks a capability this run needs (%s%s%s)\n",
                 shape.causal ? "causal" : "non-causal", heads != kv_heads ? ", GQA" : "", ", backward");
    return 1;
  }
  // Without pieces, every rank (if run under mpirun) computes the whole batch.
  const Communicator comm = first_communicator(host);

  std::mt19937_64 rng(options.seed);
  const std::vector<int64_t> lengths = draw_documents(tokens, rng);
  std::vector<cad_segment_v1_t> segments;
  int64_t offset = 0;
  double score_entries = 0;
  for (int64_t l : lengths) {
    segments.push_back({offset, l, offset, l});
    score_entries += shape.causal ? 0.5 * static_cast<double>(l) * static_cast<double>(l + 1)
                                  : static_cast<double>(l) * static_cast<double>(l);
    offset += l;
  }

  Tensor q = random_tensor({tokens, heads, head_dim}, rng);
  Tensor k = random_tensor({tokens, kv_heads, head_dim}, rng);
  Tensor v = random_tensor({tokens, kv_heads, head_dim}, rng);
  Tensor d_o = random_tensor({tokens, heads, head_dim}, rng);
  Tensor o({tokens, heads, head_dim}), lse({heads, tokens});
  Tensor d_q({tokens, heads, head_dim}), d_k({tokens, kv_heads, head_dim}), d_v({tokens, kv_heads, head_dim});
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  cad_attention_forward_args_v1_t fwd{};
  fwd.struct_size = sizeof fwd;
  fwd.segments = segments.data();
  fwd.num_segments = static_cast<int64_t>(segments.size());
  fwd.softmax_scale = scale;
  fwd.causal = shape.causal ? 1 : 0;
  fwd.q = &q.view;
  fwd.k = &k.view;
  fwd.v = &v.view;
  fwd.o = &o.view;
  fwd.lse = &lse.view;
  auto start = std::chrono::steady_clock::now();
  require(attention->forward(instance, &fwd), attention, instance, "forward");
  const double forward_ms = milliseconds_since(start);

  cad_attention_backward_args_v1_t bwd{};
  bwd.struct_size = sizeof bwd;
  bwd.segments = fwd.segments;
  bwd.num_segments = fwd.num_segments;
  bwd.softmax_scale = scale;
  bwd.causal = fwd.causal;
  bwd.q = &q.view;
  bwd.k = &k.view;
  bwd.v = &v.view;
  bwd.o = &o.view;
  bwd.lse = &lse.view;
  bwd.d_o = &d_o.view;
  bwd.d_q = &d_q.view;
  bwd.d_k = &d_k.view;
  bwd.d_v = &d_v.view;
  start = std::chrono::steady_clock::now();
  require(attention->backward(instance, &bwd), attention, instance, "backward");
  const double backward_ms = milliseconds_since(start);

  // The slowest rank's times (every rank ran the same batch, so the checksums are rank 0's).
  const std::vector<double> times = comm.all_gather({forward_ms, backward_ms});
  double slowest_forward = 0, slowest_backward = 0;
  for (size_t r = 0; r < times.size(); r += 2) {
    slowest_forward = std::max(slowest_forward, times[r]);
    slowest_backward = std::max(slowest_backward, times[r + 1]);
  }
  if (comm.rank != 0) return 0;
  // Forward: QK^T and PV, 2 FLOPs per multiply-add each: 4 * D * Hq per score entry.
  const double forward_flops = 4.0 * static_cast<double>(head_dim * heads) * score_entries;
  std::string doc_list;
  for (int64_t l : lengths) doc_list += (doc_list.empty() ? "" : " ") + std::to_string(l);
  std::printf("config     %s\n", options.config.c_str());
  std::printf("batch      %lld tokens, %zu documents (%s), %s\n", static_cast<long long>(tokens), lengths.size(),
              doc_list.c_str(), shape.causal ? "causal" : "non-causal");
  std::printf("shape      Hq=%lld Hkv=%lld D=%lld fp32, softmax scale %.4g\n", static_cast<long long>(heads),
              static_cast<long long>(kv_heads), static_cast<long long>(head_dim), static_cast<double>(scale));
  if (comm.world_size > 1) std::printf("ranks      %d, each runs the whole batch\n", comm.world_size);
  std::printf("forward    %10.3f ms  %8.2f GFLOP/s%s\n", slowest_forward, forward_flops / (slowest_forward * 1e6),
              comm.world_size > 1 ? " (slowest rank)" : "");
  std::printf("backward   %10.3f ms\n", slowest_backward);
  std::printf("sum |x|    O %.6e  LSE %.6e  dQ %.6e  dK %.6e  dV %.6e\n", o.abs_sum(), lse.abs_sum(), d_q.abs_sum(),
              d_k.abs_sum(), d_v.abs_sum());
  return 0;
}

}  // namespace cad::demo
