// cmd_demo.cpp -- `cad demo`: builds the configured stack, draws a random varlen batch (a few documents
// of random lengths summing to N tokens) and runs forward and backward through the configured
// attention instance, printing sizes, timings and checksums.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cad_host.hpp"
#include "cli_args.h"
#include "command.h"

namespace {

const char* kUsage =
    "usage: cad demo [--config FILE] [--tokens N] [--heads H] [--kv-heads H] [--head-dim D] [--seed S]\n"
    "                [--noncausal] [--path DIRS]\n\n"
    "Loads the stack of FILE (default configs/reference.json), draws a random batch of a few documents\n"
    "of random lengths summing to N tokens, and runs forward and backward through the config's\n"
    "attention instance (fp32, CPU). Prints sizes, timings and checksums. Under mpirun with a\n"
    "distributed stack (configs/cad_cpu.json) each rank holds a slice of the batch's tokens, and the\n"
    "checksums (sums over all ranks) match a one-process run up to rounding.\n\n"
    "  --tokens N     tokens in the batch (default 1024)\n"
    "  --heads H      query heads (default 8)\n"
    "  --kv-heads H   key/value heads, dividing --heads (default 2)\n"
    "  --head-dim D   head dimension (default 64)\n"
    "  --seed S       random seed of the batch (default 1)\n"
    "  --noncausal    full attention inside each document instead of causal\n"
    "  --path DIRS    directories searched for plugins first (colon-separated)\n";

// The default config: in the working directory, the source tree, or the install prefix.
std::string default_config() {
  const std::vector<std::string> candidates = {"configs/reference.json",
#ifdef CAD_SOURCE_CONFIG_DIR
                                               CAD_SOURCE_CONFIG_DIR "/reference.json",
#endif
#ifdef CAD_INSTALL_CONFIG_DIR
                                               CAD_INSTALL_CONFIG_DIR "/reference.json",
#endif
  };
  for (const auto& c : candidates) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(c, ec)) return c;
  }
  return candidates.front();
}

// A borrowed fp32 CPU tensor over a std::vector.
struct Tensor {
  std::vector<float> data;
  std::vector<int64_t> shape;
  cad_tensor_v1_t view{};

  explicit Tensor(std::vector<int64_t> dims) : shape(std::move(dims)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.assign(static_cast<size_t>(n), 0.0f);
    view.data = data.data();
    view.device = {CAD_DEVICE_CPU, 0};
    view.ndim = static_cast<int32_t>(shape.size());
    view.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
    view.shape = shape.data();
    view.strides = nullptr;
    view.byte_offset = 0;
  }
  void randomize(std::mt19937_64& rng) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& x : data) x = uniform(rng);
  }
  // Sum of |x| over finite entries: a checksum that, unlike a plain sum, does not cancel (the columns
  // of dK sum to zero analytically).
  double abs_sum() const {
    double s = 0;
    for (float x : data) {
      if (std::isfinite(x)) s += std::fabs(x);
    }
    return s;
  }
};

// Draws a [rows, ...] tensor of uniform(-1, 1) values from `rng` and keeps rows [lo, hi): every rank
// draws the whole tensor, so all ranks agree on the global batch.
Tensor random_rows(const std::vector<int64_t>& shape, int64_t lo, int64_t hi, std::mt19937_64& rng) {
  Tensor global(shape);
  global.randomize(rng);
  std::vector<int64_t> local_shape = shape;
  local_shape[0] = hi - lo;
  Tensor local(local_shape);
  const size_t row = global.data.size() / static_cast<size_t>(shape[0]);
  std::copy(global.data.begin() + static_cast<std::ptrdiff_t>(row * static_cast<size_t>(lo)),
            global.data.begin() + static_cast<std::ptrdiff_t>(row * static_cast<size_t>(hi)), local.data.begin());
  return local;
}

// The stack's first communicator instance, if any: which slice of the batch this process holds.
struct Communicator {
  const cad_communicator_v1_t* table = nullptr;
  void* instance = nullptr;
  int32_t rank = 0;
  int32_t world_size = 1;

  // Element-wise sum of the first `summed` values over ranks, maximum of the rest.
  std::vector<double> combine(const std::vector<double>& mine, size_t summed) const {
    if (table == nullptr || world_size == 1) return mine;
    std::vector<double> all(mine.size() * static_cast<size_t>(world_size));
    const cad_status_t status =
        table->all_gather(instance, mine.data(), mine.size() * sizeof(double), all.data(), nullptr);
    if (status != CAD_STATUS_OK) throw cad::Error(status, std::string("all_gather: ") + table->last_error(instance));
    std::vector<double> out(mine.size(), 0.0);
    for (size_t i = 0; i < mine.size(); ++i) {
      out[i] = i < summed ? 0.0 : all[i];
      for (int32_t r = 0; r < world_size; ++r) {
        const double x = all[static_cast<size_t>(r) * mine.size() + i];
        out[i] = i < summed ? out[i] + x : std::max(out[i], x);
      }
    }
    return out;
  }
};

Communicator find_communicator(const cad::Host& host) {
  Communicator comm;
  const int64_t count = cad_host_num_instances(host.get());
  for (int64_t i = 0; i < count && comm.table == nullptr; ++i) {
    cad_host_instance_info_v1_t info{};
    info.struct_size = sizeof info;
    if (cad_host_instance_info(host.get(), i, &info) != CAD_STATUS_OK) continue;
    if (info.plugin->kind != CAD_PLUGIN_KIND_COMMUNICATOR) continue;
    const auto* table = static_cast<const cad_communicator_v1_t*>(info.table);
    if (table->get_rank(info.instance, &comm.rank) != CAD_STATUS_OK ||
        table->get_world_size(info.instance, &comm.world_size) != CAD_STATUS_OK || comm.world_size < 1) {
      throw cad::Error(CAD_STATUS_INTERNAL, std::string("communicator '") + info.name + "' reports no rank");
    }
    comm.table = table;
    comm.instance = info.instance;
  }
  return comm;
}

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

void require(cad_status_t status, const cad_attention_v1_t* table, void* instance, const char* what) {
  if (status != CAD_STATUS_OK) {
    throw cad::Error(status, std::string(what) + " failed [" + cad_status_name(status) + "]: " +
                                 table->last_error(instance));
  }
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

int run_demo(int argc, char** argv) {
  const cad::cli::Args args(argc, argv, {"--config", "--tokens", "--heads", "--kv-heads", "--head-dim", "--seed", "--path"},
                            {"--noncausal"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args.positional().empty()) throw cad::cli::UsageError("unexpected argument '" + args.positional()[0] + "'");
  const std::string config = args.get("--config", default_config());
  const int64_t tokens = args.get_int("--tokens", 1024, 1, int64_t{1} << 24);
  const int64_t heads = args.get_int("--heads", 8, 1, 1024);
  const int64_t kv_heads = args.get_int("--kv-heads", std::min<int64_t>(2, heads), 1, heads);
  const int64_t head_dim = args.get_int("--head-dim", 64, 1, 1024);
  const int64_t seed = args.get_int("--seed", 1, 0, INT64_MAX);
  const bool causal = !args.has("--noncausal");
  if (heads % kv_heads != 0) throw cad::cli::UsageError("--heads must be a multiple of --kv-heads");
  const std::string search_path = args.get("--path", "");

  cad::Host host(config, search_path.empty() ? nullptr : search_path.c_str());
  const auto [attention, instance] = host.attention();

  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof caps;
  require(attention->get_capabilities(instance, &caps), attention, instance, "get_capabilities");
  if (caps.device_type != CAD_DEVICE_CPU || (caps.dtype_mask & CAD_ATTENTION_DTYPE_FP32) == 0) {
    std::fprintf(stderr, "cad demo: the attention instance does not take fp32 CPU tensors (the demo's only mode so far)\n");
    return 1;
  }
  const uint32_t needed = static_cast<uint32_t>(causal ? CAD_ATTENTION_CAP_CAUSAL : CAD_ATTENTION_CAP_NONCAUSAL) |
                          CAD_ATTENTION_CAP_BACKWARD |
                          (heads != kv_heads ? static_cast<uint32_t>(CAD_ATTENTION_CAP_GQA) : 0u);
  if ((caps.flags & needed) != needed) {
    std::fprintf(stderr, "cad demo: the attention instance lacks a capability this run needs (%s%s%s)\n",
                 causal ? "causal" : "non-causal", heads != kv_heads ? ", GQA" : "", ", backward");
    return 1;
  }

  // With a communicator in the stack (e.g. `mpirun -np 2 cad demo --config configs/cad_cpu.json`),
  // every rank draws the same global batch and keeps a contiguous slice of its tokens: the pieces a
  // distributed backend balances. A local backend runs the whole batch on every rank.
  const bool takes_pieces = (caps.flags & CAD_ATTENTION_CAP_PIECES) != 0;
  const Communicator comm = find_communicator(host);
  const int64_t lo = takes_pieces ? tokens * comm.rank / comm.world_size : 0;
  const int64_t hi = takes_pieces ? tokens * (comm.rank + 1) / comm.world_size : tokens;
  const int64_t local = hi - lo;

  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  const std::vector<int64_t> lengths = draw_documents(tokens, rng);
  std::vector<cad_segment_v1_t> segments;
  std::vector<cad_piece_v1_t> pieces;
  int64_t offset = 0;
  double score_entries = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t l = lengths[i];
    segments.push_back({offset, l, offset, l});
    const int64_t begin = std::max(offset, lo), end = std::min(offset + l, hi);
    if (begin < end) pieces.push_back({static_cast<int64_t>(i), l, begin - offset, end - begin});
    score_entries += causal ? 0.5 * static_cast<double>(l) * static_cast<double>(l + 1) : static_cast<double>(l) * l;
    offset += l;
  }

  Tensor q = random_rows({tokens, heads, head_dim}, lo, hi, rng);
  Tensor k = random_rows({tokens, kv_heads, head_dim}, lo, hi, rng);
  Tensor v = random_rows({tokens, kv_heads, head_dim}, lo, hi, rng);
  Tensor d_o = random_rows({tokens, heads, head_dim}, lo, hi, rng);
  Tensor o({local, heads, head_dim}), lse({heads, local});
  Tensor d_q({local, heads, head_dim}), d_k({local, kv_heads, head_dim}), d_v({local, kv_heads, head_dim});
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  cad_attention_forward_args_v1_t fwd{};
  fwd.struct_size = sizeof fwd;
  // A distributed backend takes this process's tokens as pieces of documents; a local one, segments.
  if (takes_pieces) {
    fwd.pieces = pieces.data();
    fwd.num_pieces = static_cast<int64_t>(pieces.size());
  } else {
    fwd.segments = segments.data();
    fwd.num_segments = static_cast<int64_t>(segments.size());
  }
  fwd.softmax_scale = scale;
  fwd.causal = causal ? 1 : 0;
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
  bwd.pieces = fwd.pieces;
  bwd.num_pieces = fwd.num_pieces;
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

  // Sums over every rank's tokens, and the slowest rank's times: with a distributed backend they
  // match a one-process run of the same batch up to rounding.
  std::vector<double> totals = {o.abs_sum(), lse.abs_sum(), d_q.abs_sum(), d_k.abs_sum(), d_v.abs_sum(), forward_ms,
                                backward_ms};
  totals = comm.combine(totals, 5);
  if (comm.rank != 0) return 0;
  // Forward: QK^T and PV, 2 FLOPs per multiply-add each: 4 * D * Hq per score entry.
  const double forward_flops = 4.0 * static_cast<double>(head_dim * heads) * score_entries;
  std::string doc_list;
  for (int64_t l : lengths) doc_list += (doc_list.empty() ? "" : " ") + std::to_string(l);
  std::printf("config     %s\n", config.c_str());
  std::printf("batch      %lld tokens, %zu documents (%s), %s\n", static_cast<long long>(tokens), lengths.size(),
              doc_list.c_str(), causal ? "causal" : "non-causal");
  std::printf("shape      Hq=%lld Hkv=%lld D=%lld fp32, softmax scale %.4g\n", static_cast<long long>(heads),
              static_cast<long long>(kv_heads), static_cast<long long>(head_dim), static_cast<double>(scale));
  if (comm.world_size > 1) {
    std::printf("ranks      %d (%s), %lld tokens on rank 0\n", comm.world_size,
                takes_pieces ? "tokens split across ranks" : "each runs the whole batch", static_cast<long long>(local));
  }
  std::printf("forward    %10.3f ms  %8.2f GFLOP/s%s\n", totals[5], forward_flops / (totals[5] * 1e6),
              comm.world_size > 1 ? " (slowest rank)" : "");
  std::printf("backward   %10.3f ms\n", totals[6]);
  std::printf("sum |x|    O %.6e  LSE %.6e  dQ %.6e  dK %.6e  dV %.6e\n", totals[0], totals[1], totals[2], totals[3],
              totals[4]);
  return 0;
}

}  // namespace

CAD_REGISTER_COMMAND(demo, "demo", "run a random varlen batch forward and backward through a configured stack",
                     run_demo);
