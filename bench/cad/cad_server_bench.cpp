// cad_server_bench.cpp -- CAD's server batches measured on one GPU (a benchmark, not a test).
//
// For Pretrain-recipe batches (DistCA recipe over a document-length file) of R ranks x T tokens, every
// balancer plans; then each rank's server batch (the layout CAD itself builds) runs on the one GPU, one
// after another -- an honest measure of what that rank's GPU would do -- through the cuda backend with a
// resident plan, forward and backward, timed with CUDA events (median of --reps). The same rank's pack
// and unpack copies (the wire tables the CUDA data path uses, wire_tables.h) are timed the same way, so
// their share of attention time is measured, not modelled. Workspace bytes per rank come from the data
// path's own sizing; host plan time (balancer + layout + wire tables) is measured for --plan-ranks.
//
//   cad_server_bench --dist ../shared/data/doclen_pretrain.json --ranks 4,8 --context 65536,131072
//       [--balancer colocated,per_doc_cp,distca,prefix_aware] [--heads 32] [--kv-heads 8] [--head-dim 128]
//       [--reps 3] [--seeds 1] [--plan-ranks 4,64,512] [--plan-context 131072] [--json FILE]
//       [--rate-table FILE] [--lengths FILE]
// With --rate-table, prefix_aware also runs balancing predicted time ("prefix_aware_time") and every plan's
// predicted max/mean server time is printed beside the measured one: the check that balancing time with
// the table lowers the measured imbalance (issue 14). --lengths replaces the sampled batches with one given
// batch (documents packed in order into the ranks, as `cad plan --lengths` does).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "batch_recipe.h"
#include "cad/cad_host.hpp"
#include "cad_kernels.h"
#include "doc_lengths.h"
#include "layout.h"
#include "plan_model.h"
#include "plan_time.h"
#include "rate_table.h"
#include "validate.h"
#include "wire_tables.h"

namespace {

namespace cp = cad::cad_plugin;
using cad::kernels::RowCopy;

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "cad_server_bench: %s\n", message.c_str());
  std::exit(2);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}
std::vector<std::string> str_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

struct Options {
  std::string dist = "../shared/data/doclen_pretrain.json";
  std::vector<int64_t> ranks = {4, 8}, contexts = {65536, 131072}, plan_ranks = {4, 64, 512};
  int64_t plan_context = 131072;
  std::vector<std::string> balancers = {"colocated", "per_doc_cp", "distca", "prefix_aware"};
  int hq = 32, hkv = 8, d = 128, reps = 3;
  std::vector<int64_t> seeds = {1};
  std::string lengths;  // one given batch instead of --dist's sampled ones
  std::string json;
  std::string rate_table;  // adds "prefix_aware_time": prefix_aware balancing predicted time with this table
  std::string fill = "random";  // what new device memory holds: random | constant (see Fill)
};

void parse_option(Options& o, const std::string& a, const std::string& v);

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: cad_server_bench [--dist FILE] [--ranks 4,8] [--context 65536,131072] [--balancer a,b]\n"
                  "       [--heads 32] [--kv-heads 8] [--head-dim 128] [--reps 3] [--seeds 1,2,...]\n"
                  "       [--plan-ranks 4,64,512] [--plan-context 131072] [--json FILE] [--rate-table FILE]\n"
                  "       [--lengths FILE]   (one batch: these document lengths packed into each --ranks x --context)\n"
                  "       [--fill random|constant]   (Q/K/V/dO values: random bf16 in [-1, 1) as the rate table's\n"
                  "                                   cells, or every byte 0x3c as before 2026-11-25; default random)\n"
                  "       --plan-ranks '' skips the host plan-time table\n"
                  "Measures every rank's CAD server batch (forward, backward, pack+unpack) on this GPU, one after\n"
                  "another, per balancer; and the host time to make a plan.\n");
      std::exit(0);
    }
    if (i + 1 >= argc) die("option " + a + " needs a value");
    const std::string v = argv[++i];
    try {
      parse_option(o, a, v);
    } catch (const std::logic_error&) {  // std::stoll / std::stoi: not a number, or out of range
      die("option " + a + ": '" + v + "' is not a number (or a comma-separated list of numbers)");
    }
  }
  if (o.reps < 1) die("--reps must be at least 1");
  for (const auto* list : {&o.ranks, &o.contexts}) {
    for (int64_t x : *list) {
      if (x < 1) die("--ranks and --context take positive numbers, got " + std::to_string(x));
    }
  }
  return o;
}

void parse_option(Options& o, const std::string& a, const std::string& v) {
  if (a == "--dist") o.dist = v;
  else if (a == "--ranks") o.ranks = int_list(v);
  else if (a == "--context") o.contexts = int_list(v);
  else if (a == "--plan-ranks") o.plan_ranks = int_list(v);
  else if (a == "--plan-context") o.plan_context = std::stoll(v);
  else if (a == "--balancer") o.balancers = str_list(v);
  else if (a == "--heads") o.hq = std::stoi(v);
  else if (a == "--kv-heads") o.hkv = std::stoi(v);
  else if (a == "--head-dim") o.d = std::stoi(v);
  else if (a == "--reps") o.reps = std::stoi(v);
  else if (a == "--seed" || a == "--seeds") o.seeds = int_list(v);
  else if (a == "--lengths") o.lengths = v;
  else if (a == "--json") o.json = v;
  else if (a == "--rate-table") o.rate_table = v;
  else if (a == "--fill" && (v == "random" || v == "constant")) o.fill = v;
  else die("unknown option or value " + a + " " + v + " (see --help)");
}

struct Plan {
  std::vector<cad_task_v1_t> tasks;
  cp::Layout layout;
  double plan_ms = 0;  // balancer + layout + this rank's wire tables, on the host
};

Plan make_plan(const cad::Host& host, const std::string& balancer, const cad::workload::RankPieces& ranks,
               const cp::CallShape& shape) {
  const auto [table, ctx] = host.find<cad_balancer_v1_t>(balancer, CAD_PLUGIN_KIND_BALANCER);
  std::vector<cad_rank_pieces_v1_t> views;
  for (const auto& r : ranks) views.push_back({r.data(), static_cast<int64_t>(r.size())});
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof cost;
  cost.num_q_heads = shape.num_q_heads;
  cost.num_kv_heads = shape.num_kv_heads;
  cost.head_dim = shape.head_dim;
  cost.bytes_per_element = 2;
  cost.causal = 1;
  cad_balance_input_v1_t input{};
  input.struct_size = sizeof input;
  input.ranks = views.data();
  input.num_ranks = static_cast<int32_t>(views.size());
  input.num_servers = input.num_ranks;
  input.cost = &cost;
  Plan p;
  const auto start = std::chrono::steady_clock::now();
  cad_plan_v1_t* plan = nullptr;
  if (table->plan(ctx, &input, &plan) != CAD_STATUS_OK) die(balancer + ": " + table->last_error(ctx));
  p.tasks.assign(plan->tasks, plan->tasks + plan->num_tasks);
  table->release_plan(ctx, plan);
  p.layout = cp::build_layout(ranks, p.tasks, true);
  for (bool owner : {true, false}) {
    for (bool q : {true, false}) (void)cp::build_wire_table(p.layout, 0, owner, q);
  }
  p.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return p;
}

// What new device memory is filled with (--fill). "random": bf16 values uniform in [-1, 1), as
// bench/kernels/case_timer.cu fills its batches, so that these times and the rate table's cells are taken
// under the same conditions. "constant": every byte 0x3c (bf16 0x3c3c ~ 0.0115), what this benchmark used
// before 2026-11-25: the same batch ran 10-15% faster than with random data (docs/simulate.md), most
// likely because the tensor cores draw less power on constant operands and the GPU keeps higher clocks.
// Either way every value is finite (an fp32 buffer reads the pattern's bf16 pairs as fp32 of magnitude
// < 1), so no NaN or Inf can slow a path down.
enum class Fill { kRandom, kConstant };

// 8 MiB of random bf16 values on the device, made once; buffers are filled by copying it over them.
const void* random_pattern(size_t* bytes) {
  static void* device = nullptr;
  constexpr size_t kBytes = size_t{8} << 20;
  if (!device) {
    std::vector<uint16_t> host(kBytes / 2);
    uint32_t x = 0x9e3779b9u;  // fixed seed: every run times the same values
    for (uint16_t& h : host) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;  // xorshift32
      const float f = static_cast<float>(x) / 4294967296.f * 2.f - 1.f;
      uint32_t bits = 0;
      std::memcpy(&bits, &f, sizeof bits);
      h = static_cast<uint16_t>(bits >> 16);  // bf16: the float's top half (truncated)
    }
    check(cudaMalloc(&device, kBytes), "cudaMalloc (fill pattern)");
    check(cudaMemcpy(device, host.data(), kBytes, cudaMemcpyHostToDevice), "fill pattern");
  }
  *bytes = kBytes;
  return device;
}

void fill(void* p, size_t bytes, Fill how) {
  if (how == Fill::kConstant) {
    check(cudaMemset(p, 0x3c, bytes), "fill");
    return;
  }
  size_t n = 0;
  const void* pattern = random_pattern(&n);
  for (size_t at = 0; at < bytes; at += n) {
    check(cudaMemcpy(static_cast<char*>(p) + at, pattern, std::min(n, bytes - at), cudaMemcpyDeviceToDevice), "fill");
  }
}

// Device memory for one server batch and one rank's exchanges, grown as needed and reused.
struct Buffers {
  Fill how = Fill::kRandom;
  std::map<std::string, std::pair<void*, size_t>> blocks;
  void* get(const std::string& name, size_t bytes) {
    auto& b = blocks[name];
    if (b.second < bytes) {
      if (b.first) cudaFree(b.first);
      check(cudaMalloc(&b.first, std::max<size_t>(bytes, 256)), "cudaMalloc");
      fill(b.first, std::max<size_t>(bytes, 256), how);
      b.second = std::max<size_t>(bytes, 256);
    }
    return b.first;
  }
  ~Buffers() {
    for (auto& [n, b] : blocks) cudaFree(b.first);
  }
};

cad_tensor_v1_t tensor(void* data, std::vector<int64_t>& shape, bool bf16) {
  return cad_tensor_v1_t{data, {CAD_DEVICE_CUDA, 0}, static_cast<int32_t>(shape.size()),
                         bf16 ? cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1} : cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1},
                         shape.data(), nullptr, 0};
}

// Median over reps of the GPU time of `body`.
template <class Body>
double time_ms(int reps, Body&& body) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  body();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a);
    body();
    cudaEventRecord(b);
    check(cudaEventSynchronize(b), "timing");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct RankResult {
  double fwd_ms = 0, bwd_ms = 0, pack_fwd_ms = 0, pack_bwd_ms = 0;
  int64_t workspace_bytes = 0, saved_bytes = 0, q_rows = 0, kv_rows = 0, segments = 0;
};

// Uploads a wire table's copies (both directions) and returns device pointers.
struct DeviceTable {
  RowCopy* to = nullptr;
  RowCopy* from = nullptr;
  int64_t n = 0;
  bool identity = true, exclusive = false;
  std::vector<int64_t> peer_first;
  // As the NCCL data path: a side whose rows form one range per peer is read/written in place.
  explicit DeviceTable(const cp::WireTable& t) : n(static_cast<int64_t>(t.to_wire.size())), identity(t.direct),
                                                  exclusive(t.exclusive), peer_first(t.peer_first) {
    const size_t bytes = std::max<size_t>(1, t.to_wire.size()) * sizeof(RowCopy);
    check(cudaMalloc(&to, bytes), "cudaMalloc");
    check(cudaMalloc(&from, bytes), "cudaMalloc");
    if (n > 0) {
      check(cudaMemcpy(to, t.to_wire.data(), t.to_wire.size() * sizeof(RowCopy), cudaMemcpyHostToDevice), "table");
      check(cudaMemcpy(from, t.from_wire.data(), t.from_wire.size() * sizeof(RowCopy), cudaMemcpyHostToDevice), "table");
    }
  }
  ~DeviceTable() { cudaFree(to); cudaFree(from); }
};

// A plain copy list as a DeviceTable (the dK/dV return lists), with optional per-peer starts.
cp::WireTable list_table(const std::vector<cp::WireCopy>& copies, const std::vector<int64_t>& peer_first) {
  cp::WireTable t;
  t.to_wire = copies;
  t.from_wire = copies;
  t.peer_first = peer_first;
  t.identity = false;
  return t;
}

// The copies the CUDA data path (device_path.cpp, Mover) makes on rank `me` in one forward or one
// backward (keep mode) over NCCL, with the same skips: a side whose rows form one range per peer moves
// nothing (the collective reads or writes the tensor), and dK/dV rows that come back from one server each
// are moved, not summed.
double time_pack_unpack(const cp::Layout& layout, int32_t me, const cp::CallShape& s, Buffers& buf, int reps,
                        bool backward) {
  const DeviceTable oq(cp::build_wire_table(layout, me, true, true)),
      okv(cp::build_wire_table(layout, me, true, false, s.tokens));
  const DeviceTable sq(cp::build_wire_table(layout, me, false, true)), skv(cp::build_wire_table(layout, me, false, false));
  const int64_t qb = s.q_row_bytes(), kvb = s.kv_row_bytes(), hq = s.num_q_heads;
  const cp::ServerBatch& batch = layout.servers[static_cast<size_t>(me)];
  const int64_t tokens = s.tokens;
  const cp::WireTable okv_host = cp::build_wire_table(layout, me, true, false, s.tokens);
  const size_t wire = static_cast<size_t>(cp::workspace_sizes(layout, me, s, true, 0, 0).wire);
  // The owner's dK/dV return: moved rows, and the shared rows' sum index (as the data path uploads it).
  const DeviceTable single(list_table(okv_host.single, {}));
  std::vector<int64_t> index = okv_host.shared_owner_rows;
  index.insert(index.end(), okv_host.shared_first.begin(), okv_host.shared_first.end());
  index.insert(index.end(), okv_host.shared_wire_rows.begin(), okv_host.shared_wire_rows.end());
  int64_t* sum_index = static_cast<int64_t*>(buf.get("sum_index", index.size() * sizeof(int64_t)));
  check(cudaMemcpy(sum_index, index.data(), index.size() * sizeof(int64_t), cudaMemcpyHostToDevice), "sum index");
  const int64_t shared = okv_host.shared_rows;
  void* owner_q = buf.get("owner_q", static_cast<size_t>(tokens * qb));
  void* owner_kv = buf.get("owner_kv", static_cast<size_t>(tokens * kvb));
  float* owner_lse = static_cast<float*>(buf.get("owner_lse", static_cast<size_t>(tokens * hq * 4)));
  void* server_q = buf.get("q", static_cast<size_t>(batch.q_rows * qb));
  void* server_kv = buf.get("k", static_cast<size_t>(batch.kv_rows * kvb));
  float* server_lse = static_cast<float*>(buf.get("lse", static_cast<size_t>(batch.q_rows * hq * 4)));
  void* send = buf.get("send", wire);
  void* recv = buf.get("recv", wire);
  auto gather = [&](const DeviceTable& t, const void* src, int64_t rb) {
    if (!t.identity) check(cad::kernels::copy_row_ranges(src, send, rb, t.to, t.n, nullptr), "gather");
  };
  auto scatter = [&](const DeviceTable& t, void* dst, int64_t rb) {
    if (!t.identity) check(cad::kernels::copy_row_ranges(recv, dst, rb, t.from, t.n, nullptr), "scatter");
  };
  return time_ms(reps, [&] {
    if (!backward) {
      gather(oq, owner_q, qb);                                   // Q out
      gather(okv, owner_kv, kvb), gather(okv, owner_kv, kvb);    // K, V out
      scatter(sq, server_q, qb);                                 // into the server batch (unless in place)
      scatter(skv, server_kv, kvb), scatter(skv, server_kv, kvb);
      gather(sq, server_q, qb);                                  // O back
      cad::kernels::copy_strided_rows_f32(server_lse, 1, batch.q_rows, static_cast<float*>(send), hq, 1, hq, sq.to,
                                          sq.n, nullptr);        // LSE back
      scatter(oq, owner_q, qb);                                  // O into the host's order
      cad::kernels::copy_strided_rows_f32(static_cast<float*>(recv), hq, 1, owner_lse, 1, tokens, hq, oq.from, oq.n,
                                          nullptr);
    } else {
      gather(oq, owner_q, qb);                                   // dO out
      scatter(sq, server_q, qb);
      gather(sq, server_q, qb);                                  // dQ back
      scatter(oq, owner_q, qb);
      for (int part = 0; part < 2; ++part) {                     // dK, dV back and summed per peer
        gather(skv, server_kv, kvb);
        if (okv.exclusive) {
          scatter(okv, owner_kv, kvb);
          continue;
        }
        cad::kernels::copy_row_ranges(recv, owner_kv, kvb, single.to, single.n, nullptr);
        cad::kernels::sum_rows(recv, true, kvb / 2, sum_index + shared, sum_index + 2 * shared + 1, sum_index, shared,
                               owner_kv, nullptr);
      }
    }
  });
}

RankResult measure_rank(const cad::Host& host, const cp::Layout& layout, int32_t me, const cp::CallShape& shape,
                        Buffers& buf, int reps) {
  const auto [api, ctx] = host.find<cad_attention_v1_t>("cuda", CAD_PLUGIN_KIND_ATTENTION);
  const cp::ServerBatch& batch = layout.servers[static_cast<size_t>(me)];
  RankResult r;
  r.q_rows = batch.q_rows;
  r.kv_rows = batch.kv_rows;
  r.segments = static_cast<int64_t>(batch.segments.size());
  const cp::WireTable okv = cp::build_wire_table(layout, me, true, false, shape.tokens);
  const cp::WorkspaceSizes w = cp::workspace_sizes(
      layout, me, shape, true, 0,
      static_cast<int64_t>(okv.shared_owner_rows.size() + okv.shared_first.size() + okv.shared_wire_rows.size()));
  r.workspace_bytes = w.plan_total();
  r.saved_bytes = w.saved_per_forward();
  r.pack_fwd_ms = time_pack_unpack(layout, me, shape, buf, reps, false);
  r.pack_bwd_ms = time_pack_unpack(layout, me, shape, buf, reps, true);
  if (batch.q_rows == 0) return r;
  const int64_t qb = shape.q_row_bytes(), kvb = shape.kv_row_bytes();
  std::vector<int64_t> qs{batch.q_rows, shape.num_q_heads, shape.head_dim}, ks{batch.kv_rows, shape.num_kv_heads,
                                                                               shape.head_dim};
  std::vector<int64_t> ls{shape.num_q_heads, batch.q_rows};
  cad_tensor_v1_t q = tensor(buf.get("q", static_cast<size_t>(batch.q_rows * qb)), qs, true);
  cad_tensor_v1_t k = tensor(buf.get("k", static_cast<size_t>(batch.kv_rows * kvb)), ks, true);
  cad_tensor_v1_t v = tensor(buf.get("v", static_cast<size_t>(batch.kv_rows * kvb)), ks, true);
  cad_tensor_v1_t o = tensor(buf.get("o", static_cast<size_t>(batch.q_rows * qb)), qs, true);
  cad_tensor_v1_t lse = tensor(buf.get("lse", static_cast<size_t>(batch.q_rows * shape.num_q_heads * 4)), ls, false);
  cad_tensor_v1_t d_o = tensor(buf.get("d_o", static_cast<size_t>(batch.q_rows * qb)), qs, true);
  cad_tensor_v1_t d_q = tensor(buf.get("d_q", static_cast<size_t>(batch.q_rows * qb)), qs, true);
  cad_tensor_v1_t d_k = tensor(buf.get("d_k", static_cast<size_t>(batch.kv_rows * kvb)), ks, true);
  cad_tensor_v1_t d_v = tensor(buf.get("d_v", static_cast<size_t>(batch.kv_rows * kvb)), ks, true);
  const cad_attention_plan_args_v1_t pa = cp::server_plan_args(batch, shape, nullptr);  // shape: bf16, causal, CUDA 0
  void* plan = nullptr;
  if (api->make_plan(ctx, &pa, &plan) != CAD_STATUS_OK) die(std::string("cuda make_plan: ") + api->last_error(ctx));
  cad_attention_forward_args_v1_t fa{};
  fa.struct_size = sizeof fa;
  fa.softmax_scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  fa.causal = 1;
  fa.q = &q, fa.k = &k, fa.v = &v, fa.o = &o, fa.lse = &lse;
  fa.plan = plan;
  cad_attention_backward_args_v1_t ba{};
  ba.struct_size = sizeof ba;
  ba.softmax_scale = fa.softmax_scale;
  ba.causal = 1;
  ba.q = &q, ba.k = &k, ba.v = &v, ba.o = &o, ba.lse = &lse, ba.d_o = &d_o, ba.d_q = &d_q, ba.d_k = &d_k, ba.d_v = &d_v;
  ba.plan = plan;
  r.fwd_ms = time_ms(reps, [&] {
    if (api->forward(ctx, &fa) != CAD_STATUS_OK) die(std::string("forward: ") + api->last_error(ctx));
  });
  r.bwd_ms = time_ms(reps, [&] {
    if (api->backward(ctx, &ba) != CAD_STATUS_OK) die(std::string("backward: ") + api->last_error(ctx));
  });
  api->release_plan(ctx, plan);
  return r;
}

double max_over_mean(const std::vector<double>& v) {
  double mx = 0, sum = 0;
  for (double x : v) mx = std::max(mx, x), sum += x;
  return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 1.0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse(argc, argv);
  const bool given_batch = !opt.lengths.empty();
  const std::vector<int64_t> lengths = cad::workload::load_lengths(given_batch ? opt.lengths : opt.dist);
  if (opt.seeds.empty()) die("--seeds: give at least one seed");
  // One batch of `ranks` x `context` tokens: the given lengths packed in order, or sampled (DistCA recipe).
  const auto batch_of = [&](int64_t context, int64_t ranks, int64_t seed) {
    return given_batch ? cad::workload::pack(lengths, context, static_cast<int32_t>(ranks))
                       : cad::workload::sample_batch(lengths, context, static_cast<int32_t>(ranks),
                                                     static_cast<uint64_t>(seed));
  };
  // Loaded here as well as by the balancer instance: a bad file stops the bench before any GPU work.
  cad::plan::RateTable rates;
  if (!opt.rate_table.empty()) rates = cad::plan::load_rate_table(opt.rate_table);
  nlohmann::json instances = nlohmann::json::array();
  for (const std::string& b : opt.balancers) instances.push_back({{"name", b}, {"plugin", b}, {"config", nlohmann::json::object()}});
  if (!opt.rate_table.empty()) {
    instances.push_back({{"name", "prefix_aware_time"}, {"plugin", "prefix_aware"},
                         {"config", {{"rate_table", opt.rate_table}}}});
    opt.balancers.push_back("prefix_aware_time");
  }
  instances.push_back({{"name", "cuda"}, {"plugin", "cuda"}, {"config", nlohmann::json::object()}});
  const std::string config = nlohmann::json{{"log_level", "warn"}, {"instances", instances}}.dump();
  cad_host_options_v1_t options{};
  options.struct_size = sizeof options;
  options.config_json = config.c_str();
  cad::Host host(options);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  nlohmann::json out = {{"gpu", prop.name}, {"heads", opt.hq}, {"kv_heads", opt.hkv}, {"head_dim", opt.d},
                        {"reps", opt.reps}, {"seeds", opt.seeds}, {"rate_table", opt.rate_table}, {"fill", opt.fill},
                        {"batch", given_batch ? "lengths " + opt.lengths : "sampled from " + opt.dist},
                        {"cases", nlohmann::json::array()}};
  Buffers buf;
  buf.how = opt.fill == "constant" ? Fill::kConstant : Fill::kRandom;
  std::printf("GPU: %s; Hq=%d Hkv=%d D=%d bf16 causal, %s data; times: median of %d\n", prop.name, opt.hq, opt.hkv,
              opt.d, opt.fill.c_str(), opt.reps);
  std::printf("| ranks x tokens | seed | balancer | model max/mean (FLOPs) | predicted time max/mean | fwd max/mean | "
              "bwd max/mean | fwd+bwd max/mean | fwd ms per rank | bwd ms per rank | pack+unpack / attention | "
              "workspace GiB (max rank) | saved GiB per fwd (max) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t ranks : opt.ranks) {
    for (int64_t context : opt.contexts) {
      for (int64_t seed : given_batch ? std::vector<int64_t>{0} : opt.seeds) {
        const auto pieces = batch_of(context, ranks, seed);
        cp::CallShape shape;
        shape.num_q_heads = opt.hq, shape.num_kv_heads = opt.hkv, shape.head_dim = opt.d, shape.bf16 = true;
        shape.causal = true, shape.device_type = CAD_DEVICE_CUDA;
        for (const std::string& balancer : opt.balancers) {
          const Plan plan = make_plan(host, balancer, pieces, shape);
          cad::plan::ModelParams mp;
          mp.num_q_heads = opt.hq, mp.num_kv_heads = opt.hkv, mp.head_dim = opt.d;
          const auto model = cad::plan::evaluate_plan(pieces, static_cast<int32_t>(ranks), plan.tasks.data(),
                                                      static_cast<int64_t>(plan.tasks.size()), mp);
          double predicted = 0;  // max/mean of the rate table's predicted fwd+bwd seconds per server
          if (!opt.rate_table.empty()) {
            predicted = cad::plan::imbalance_of(cad::plan::server_seconds(
                pieces, static_cast<int32_t>(ranks), plan.tasks.data(), static_cast<int64_t>(plan.tasks.size()), mp, rates));
          }
          std::vector<double> fwd, bwd, total;
          double pack = 0, attention = 0;
          int64_t workspace = 0, saved = 0;
          nlohmann::json per_rank = nlohmann::json::array();
          std::string fwd_list, bwd_list;
          for (int32_t r = 0; r < ranks; ++r) {
            shape.tokens = 0;
            for (const auto& p : pieces[static_cast<size_t>(r)]) shape.tokens += p.len;
            const RankResult rr = measure_rank(host, plan.layout, r, shape, buf, opt.reps);
            fwd.push_back(rr.fwd_ms);
            bwd.push_back(rr.bwd_ms);
            total.push_back(rr.fwd_ms + rr.bwd_ms);
            pack = std::max(pack, (rr.pack_fwd_ms + rr.pack_bwd_ms) / std::max(1e-9, rr.fwd_ms + rr.bwd_ms));
            attention += rr.fwd_ms + rr.bwd_ms;
            workspace = std::max(workspace, rr.workspace_bytes);
            saved = std::max(saved, rr.saved_bytes);
            char item[64];
            std::snprintf(item, sizeof item, "%s%.2f", r ? " / " : "", rr.fwd_ms);
            fwd_list += item;
            std::snprintf(item, sizeof item, "%s%.2f", r ? " / " : "", rr.bwd_ms);
            bwd_list += item;
            per_rank.push_back({{"rank", r}, {"forward_ms", rr.fwd_ms}, {"backward_ms", rr.bwd_ms},
                                {"pack_unpack_forward_ms", rr.pack_fwd_ms}, {"pack_unpack_backward_ms", rr.pack_bwd_ms},
                                {"q_rows", rr.q_rows}, {"kv_rows", rr.kv_rows}, {"segments", rr.segments},
                                {"workspace_bytes", rr.workspace_bytes}, {"saved_bytes_per_forward", rr.saved_bytes},
                                {"model_score_entries", model.cost[static_cast<size_t>(r)]}});
          }
          char predicted_text[32] = "-";
          if (!opt.rate_table.empty()) std::snprintf(predicted_text, sizeof predicted_text, "%.3f", predicted);
          std::printf("| %lld x %lldK | %s | %s | %.3f | %s | %.3f | %.3f | %.3f | %s | %s | %.2f%% (max rank) | %.2f | %.2f |\n",
                      static_cast<long long>(ranks), static_cast<long long>(context / 1024),
                      given_batch ? "-" : std::to_string(seed).c_str(), balancer.c_str(), model.imbalance,
                      predicted_text,
                      max_over_mean(fwd), max_over_mean(bwd), max_over_mean(total), fwd_list.c_str(), bwd_list.c_str(),
                      100.0 * pack, static_cast<double>(workspace) / (1 << 30), static_cast<double>(saved) / (1 << 30));
          std::fflush(stdout);
          out["cases"].push_back({{"ranks", ranks}, {"context", context}, {"seed", seed}, {"balancer", balancer},
                                  {"model_imbalance", model.imbalance}, {"predicted_time_imbalance", predicted},
                                  {"forward_imbalance", max_over_mean(fwd)}, {"backward_imbalance", max_over_mean(bwd)},
                                  {"total_imbalance", max_over_mean(total)}, {"max_pack_unpack_share", pack},
                                  {"bytes_moved_forward", model.total_bytes}, {"plan_ms_host", plan.plan_ms},
                                  {"ranks_detail", per_rank}});
        }
      }
    }
  }
  // Host time to make a plan at scale (no GPU): balancer + layout + one rank's wire tables, one core.
  std::printf("\n| ranks x tokens | balancer | host plan ms (balancer + layout + wire tables) |\n|---|---|---|\n");
  out["plan_time"] = nlohmann::json::array();
  for (int64_t ranks : opt.plan_ranks) {
    const auto pieces = batch_of(opt.plan_context, ranks, opt.seeds.front());
    cp::CallShape shape;
    shape.num_q_heads = opt.hq, shape.num_kv_heads = opt.hkv, shape.head_dim = opt.d, shape.bf16 = true;
    for (const std::string& balancer : opt.balancers) {
      double best = 1e300;
      for (int i = 0; i < 3; ++i) best = std::min(best, make_plan(host, balancer, pieces, shape).plan_ms);
      std::printf("| %lld x %lldK | %s | %.2f |\n", static_cast<long long>(ranks),
                  static_cast<long long>(opt.plan_context / 1024), balancer.c_str(), best);
      out["plan_time"].push_back({{"ranks", ranks}, {"context", opt.plan_context}, {"balancer", balancer}, {"ms", best}});
    }
  }
  if (!opt.json.empty()) std::ofstream(opt.json) << out.dump(1) << "\n";
  return 0;
}
