// cad_server_bench.cpp -- CAD's server batches measured on one GPU (a benchmark, not a test).
//
// For Pretrain-recipe batches (DistCA recipe over a document-length file) of R ranks x T tokens, every
// balancer plans; then each rank's server batch (the layout CAD itself builds) runs on the one GPU -- an
// honest measure of what that rank's GPU would do -- through the cuda backend with a resident plan (or,
// when all the case's plans do not fit in device memory, one made before each timing), forward and
// backward, timed with CUDA events. All balancers' batches of a case are timed together in
// --reps interleaved rounds: one untimed pass, then per round every (balancer, rank) batch once, forward
// then backward, the walk reversed on odd rounds; a batch's time is the median of its rounds. So no batch
// is always timed early or late: identical batches timed one after the other (as this benchmark did
// before) differed by 4-7%, the GPU's clock drifting under power and heat. With NVML (loaded at run time)
// the SM clock, power and temperature are read after every timed call. The same rank's pack and unpack
// copies (the wire tables the CUDA data path uses, wire_tables.h) are timed rank by rank before the
// rounds (median of --reps), so their share of attention time is measured, not modelled. Workspace bytes
// per rank come from the data path's own sizing; host plan time (balancer + layout + wire tables) is
// measured for --plan-ranks.
//
//   cad_server_bench --dist ../shared/data/doclen_pretrain.json --ranks 4,8 --context 65536,131072
//       [--balancer colocated,per_doc_cp,distca,prefix_aware] [--heads 32] [--kv-heads 8] [--head-dim 128]
//       [--reps 3] [--seeds 1] [--plan-ranks 4,64,512] [--plan-context 131072] [--json FILE]
//       [--rate-table FILE] [--min-time-gain G] [--lengths FILE]
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
#include "pack.h"
#include "doc_lengths.h"
#include "layout.h"
#include "nvml_telemetry.h"
#include "plan_model.h"
#include "plan_time.h"
#include "rate_table.h"
#include "validate.h"
#include "wire_tables.h"

namespace {

namespace cp = cad::cad_plugin;
using cad::bench::GpuSample;
using cad::bench::NvmlTelemetry;
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
  double min_time_gain = -1;  // prefix_aware_time's "min_time_gain"; < 0: the plugin's default
  std::string fill = "random";  // what new device memory holds: random | constant (see Fill)
};

void parse_option(Options& o, const std::string& a, const std::string& v);

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: cad_server_bench [--dist FILE] [--ranks 4,8] [--context 65536,131072] [--balancer a,b]\n"
                  "       [--heads 32] [--kv-heads 8] [--head-dim 128] [--reps 3 (rounds)] [--seeds 1,2,...]\n"
                  "       [--plan-ranks 4,64,512] [--plan-context 131072] [--json FILE] [--rate-table FILE]\n"
                  "       [--lengths FILE]   (one batch: these document lengths packed into each --ranks x --context)\n"
                  "       [--min-time-gain G]  (prefix_aware_time's min_time_gain; 0: always its time-balanced plan)\n"
                  "       [--fill random|constant]   (Q/K/V/dO values: random bf16 in [-1, 1) as the rate table's\n"
                  "                                   cells, or every byte 0x3c as before 2026-11-25; default random)\n"
                  "       --plan-ranks '' skips the host plan-time table\n"
                  "Measures every rank's CAD server batch (forward, backward, pack+unpack) on this GPU, and the host\n"
                  "time to make a plan. --reps counts interleaved rounds: per (ranks, context, seed) case, one untimed\n"
                  "pass, then per round every (balancer, rank) batch once, forward then backward, in reverse order on\n"
                  "odd rounds; a time is the median of the rounds (5 recommended). With NVML, the SM clock, power and\n"
                  "temperature after every timed call go into --json, their range per case under the table.\n");
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
  else if (a == "--min-time-gain") o.min_time_gain = std::stod(v);
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

// The median of the values (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// CUDA events around one call.
struct EventTimer {
  cudaEvent_t a = nullptr, b = nullptr;
  EventTimer() {
    check(cudaEventCreate(&a), "cudaEventCreate");
    check(cudaEventCreate(&b), "cudaEventCreate");
  }
  ~EventTimer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  template <class Body>
  double ms(Body&& body) {
    check(cudaEventRecord(a), "cudaEventRecord");
    body();
    check(cudaEventRecord(b), "cudaEventRecord");
    check(cudaEventSynchronize(b), "timing");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    return t;
  }
};

// Median over reps of the GPU time of `body`, after one untimed run.
template <class Body>
double time_ms(int reps, Body&& body) {
  EventTimer timer;
  body();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) ms.push_back(timer.ms(body));
  return median(ms);
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
  bool exclusive = false;
  std::vector<int64_t> peer_first;
  explicit DeviceTable(const cp::WireTable& t) : n(static_cast<int64_t>(t.to_wire.size())), exclusive(t.exclusive),
                                                  peer_first(t.peer_first) {
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
// backward (keep mode): every row a side sends is copied once (packed for the other ranks, or its own rows
// straight into their destination), every row received from another rank is unpacked once, and dK/dV rows that
// come back from one server each are moved, not summed. (The own rows of LSE and summed dK/dV go through the
// receive buffer, a second pass over them: not counted, LSE is small.)
double time_pack_unpack(const cp::Layout& layout, int32_t me, const cp::CallShape& s, Buffers& buf, int reps,
                        bool backward) {
  const DeviceTable oq(cp::build_wire_table(layout, me, true, true)),
      okv(cp::build_wire_table(layout, me, true, false, s.tokens));
  const DeviceTable sq(cp::build_wire_table(layout, me, false, true)), skv(cp::build_wire_table(layout, me, false, false));
  const int64_t qb = s.q_row_bytes(), kvb = s.kv_row_bytes(), hq = s.num_q_heads;
  const cp::ServerBatch& batch = layout.servers[static_cast<size_t>(me)];
  const int64_t tokens = s.tokens;
  const cp::WireTable okv_host = cp::build_wire_table(layout, me, true, false, s.tokens);
  // The copies gather a whole tensor's rows (own rows included) into one buffer: as large as the largest side.
  int64_t owner_rows_q = 0, owner_rows_kv = 0, server_rows_q = 0, server_rows_kv = 0;
  for (int32_t peer = 0; peer < layout.world; ++peer) {
    owner_rows_q += layout.route(me, peer).q_rows, owner_rows_kv += layout.route(me, peer).kv_rows;
    server_rows_q += layout.route(peer, me).q_rows, server_rows_kv += layout.route(peer, me).kv_rows;
  }
  const size_t wire = static_cast<size_t>(std::max(std::max(owner_rows_q, server_rows_q) * (qb + hq * 4),
                                                   std::max(owner_rows_kv, server_rows_kv) * kvb));
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
    check(cad::kernels::copy_row_ranges(src, send, rb, t.to, t.n, nullptr), "gather");
  };
  auto scatter = [&](const DeviceTable& t, void* dst, int64_t rb) {  // the other ranks' rows: before and after mine
    const int64_t mine = t.peer_first[static_cast<size_t>(me)], next = t.peer_first[static_cast<size_t>(me) + 1];
    check(cad::kernels::copy_row_ranges(recv, dst, rb, t.from, mine, nullptr), "scatter");
    check(cad::kernels::copy_row_ranges(recv, dst, rb, t.from + next, t.n - next, nullptr), "scatter");
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

// What one (balancer, rank) server batch is, measured outside the rounds: its sizes, the data path's
// workspace bytes, and its pack/unpack copies (timed rank by rank as before: they are a few percent of
// attention, so when they are timed hardly moves them).
RankResult rank_facts(const cp::Layout& layout, int32_t me, const cp::CallShape& shape, Buffers& buf, int reps) {
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
  return r;
}

// One (balancer, rank) server batch of a case, and what the rounds measured of it.
struct Pair {
  int32_t rank = 0;
  cp::CallShape shape;                     // tokens: this rank's
  const cp::Layout* layout = nullptr;      // the case's layout of this pair's balancer
  const cp::ServerBatch* batch = nullptr;  // layout->servers[rank]
  RankResult facts;
  void* plan = nullptr;                    // the cuda backend's plan, while resident
  std::vector<double> fwd_ms, bwd_ms;      // per round, in round order
  std::vector<GpuSample> after_fwd, after_bwd;  // per round, with NVML
};

// The attention backend the batches run on (the "cuda" instance).
struct Backend {
  const cad_attention_v1_t* api = nullptr;
  void* ctx = nullptr;
  void* make_plan(const Pair& p, cad_status_t* status) const {
    const cad_attention_plan_args_v1_t pa = cp::server_plan_args(*p.batch, p.shape, nullptr);  // bf16, causal, CUDA 0
    void* plan = nullptr;
    *status = api->make_plan(ctx, &pa, &plan);
    if (*status != CAD_STATUS_OK && *status != CAD_STATUS_OUT_OF_MEMORY) {
      die("cuda make_plan (rank " + std::to_string(p.rank) + "): " + api->last_error(ctx));
    }
    return *status == CAD_STATUS_OK ? plan : nullptr;
  }
};

// One batch's tensors (views of the shared buffers, which are sized for the case's largest batch, so
// getting them allocates nothing) and the forward / backward arguments over them. Built before a timed
// call's first event, so the events hold only the backend's call. Not copyable: the arguments point at
// the tensors.
struct Call {
  std::vector<int64_t> qs, ks, ls;
  cad_tensor_v1_t q, k, v, o, lse, d_o, d_q, d_k, d_v;
  cad_attention_forward_args_v1_t fa{};
  cad_attention_backward_args_v1_t ba{};
  Call(const Pair& p, Buffers& buf, void* plan)
      : qs{p.batch->q_rows, p.shape.num_q_heads, p.shape.head_dim},
        ks{p.batch->kv_rows, p.shape.num_kv_heads, p.shape.head_dim},
        ls{p.shape.num_q_heads, p.batch->q_rows},
        q(tensor(buf.get("q", bytes(p, true)), qs, true)),
        k(tensor(buf.get("k", bytes(p, false)), ks, true)),
        v(tensor(buf.get("v", bytes(p, false)), ks, true)),
        o(tensor(buf.get("o", bytes(p, true)), qs, true)),
        lse(tensor(buf.get("lse", lse_bytes(p)), ls, false)),
        d_o(tensor(buf.get("d_o", bytes(p, true)), qs, true)),
        d_q(tensor(buf.get("d_q", bytes(p, true)), qs, true)),
        d_k(tensor(buf.get("d_k", bytes(p, false)), ks, true)),
        d_v(tensor(buf.get("d_v", bytes(p, false)), ks, true)) {
    fa.struct_size = sizeof fa;
    fa.softmax_scale = 1.0f / std::sqrt(static_cast<float>(p.shape.head_dim));
    fa.causal = 1;
    fa.q = &q, fa.k = &k, fa.v = &v, fa.o = &o, fa.lse = &lse;
    fa.plan = plan;
    ba.struct_size = sizeof ba;
    ba.softmax_scale = fa.softmax_scale;
    ba.causal = 1;
    ba.q = &q, ba.k = &k, ba.v = &v, ba.o = &o, ba.lse = &lse, ba.d_o = &d_o, ba.d_q = &d_q, ba.d_k = &d_k, ba.d_v = &d_v;
    ba.plan = plan;
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  // Bytes of a Q-shaped (q) or K-shaped tensor, and of the LSE.
  static size_t bytes(const Pair& p, bool q) {
    return static_cast<size_t>(q ? p.batch->q_rows * p.shape.q_row_bytes() : p.batch->kv_rows * p.shape.kv_row_bytes());
  }
  static size_t lse_bytes(const Pair& p) { return static_cast<size_t>(p.batch->q_rows * p.shape.num_q_heads * 4); }
};

// Sizes the shared batch buffers for the largest batch of the case once, so that no batch of the rounds
// reallocates (and refills) them.
void reserve_batch_buffers(const std::vector<Pair>& pairs, Buffers& buf) {
  const Pair* big_q = nullptr;
  const Pair* big_kv = nullptr;
  for (const Pair& p : pairs) {
    if (!big_q || Call::bytes(p, true) > Call::bytes(*big_q, true)) big_q = &p;
    if (!big_kv || Call::bytes(p, false) > Call::bytes(*big_kv, false)) big_kv = &p;
  }
  if (!big_q) return;
  for (const char* name : {"q", "o", "d_o", "d_q"}) buf.get(name, Call::bytes(*big_q, true));
  for (const char* name : {"k", "v", "d_k", "d_v"}) buf.get(name, Call::bytes(*big_kv, false));
  buf.get("lse", Call::lse_bytes(*big_q));
}

// Every pair's cuda plan made up front and kept (resident) through the rounds. The plans hold device
// workspaces (the backward's fp32 dQ accumulator alone is 4 bytes x Hq x D per query row, plus fp32 dK/dV
// accumulators when segments share keys), so a case of many large batches may not fit: then false, with
// no plan kept, and the rounds make each pair's plan just before timing it.
bool make_resident_plans(const Backend& be, std::vector<Pair>& pairs) {
  for (Pair& p : pairs) {
    if (p.batch->q_rows == 0) continue;
    cad_status_t status = CAD_STATUS_OK;
    p.plan = be.make_plan(p, &status);
    if (status == CAD_STATUS_OK) continue;
    for (Pair& made : pairs) {
      if (made.plan) be.api->release_plan(be.ctx, made.plan), made.plan = nullptr;
    }
    (void)cudaGetLastError();  // the failed allocation's error, so that no later launch check reports it
    check(cudaDeviceSynchronize(), "releasing the plans");
    return false;
  }
  return true;
}

// Runs one pair's forward then backward; with `timed`, records both times and a telemetry reading after
// each. Without a resident plan the pair's plan is made before and released after (outside the events).
void run_pair(const Backend& be, Pair& p, Buffers& buf, EventTimer& timer, const NvmlTelemetry& nvml, bool timed) {
  if (p.batch->q_rows == 0) return;  // an empty server batch: nothing runs
  void* plan = p.plan;
  if (!plan) {
    cad_status_t status = CAD_STATUS_OK;
    plan = be.make_plan(p, &status);
    if (!plan) die("cuda make_plan (rank " + std::to_string(p.rank) + "): " + be.api->last_error(be.ctx));
    check(cudaDeviceSynchronize(), "make_plan");
  }
  Call call(p, buf, plan);
  const double f = timer.ms([&] {
    if (be.api->forward(be.ctx, &call.fa) != CAD_STATUS_OK) die(std::string("forward: ") + be.api->last_error(be.ctx));
  });
  const GpuSample after_fwd = nvml.sample();
  const double b = timer.ms([&] {
    if (be.api->backward(be.ctx, &call.ba) != CAD_STATUS_OK) die(std::string("backward: ") + be.api->last_error(be.ctx));
  });
  const GpuSample after_bwd = nvml.sample();
  if (plan != p.plan) be.api->release_plan(be.ctx, plan);
  if (!timed) return;
  p.fwd_ms.push_back(f);
  p.bwd_ms.push_back(b);
  if (nvml.available()) p.after_fwd.push_back(after_fwd), p.after_bwd.push_back(after_bwd);
}

// The measurement itself: one untimed pass over all pairs, then `rounds` timed passes, each walking every
// (balancer, rank) pair of the case once, forward on even rounds and in reverse on odd ones, so that no
// batch is always measured early or late (the GPU's clock drifts over a run: identical batches timed one
// after the other differed by 4-7%).
void run_rounds(const Backend& be, std::vector<Pair>& pairs, Buffers& buf, const NvmlTelemetry& nvml, int rounds) {
  EventTimer timer;
  for (Pair& p : pairs) run_pair(be, p, buf, timer, nvml, false);
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < pairs.size(); ++i) {
      run_pair(be, pairs[round % 2 == 0 ? i : pairs.size() - 1 - i], buf, timer, nvml, true);
    }
  }
}

// The spread of one pair's repeats: (max - min) / median of its rounds (0 for an empty batch).
double repeat_spread(const std::vector<double>& rounds) {
  const double m = median(rounds);
  if (m <= 0) return 0;
  const auto [lo, hi] = std::minmax_element(rounds.begin(), rounds.end());
  return (*hi - *lo) / m;
}

double max_over_mean(const std::vector<double>& v) {
  double mx = 0, sum = 0;
  for (double x : v) mx = std::max(mx, x), sum += x;
  return sum > 0 ? mx / (sum / static_cast<double>(v.size())) : 1.0;
}

// Per round [after forward, after backward] of one telemetry field.
template <class Field>
nlohmann::json sample_rounds(const Pair& p, Field field) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < p.after_fwd.size(); ++i) out.push_back({field(p.after_fwd[i]), field(p.after_bwd[i])});
  return out;
}

// What the GPU reported over a whole case (all balancers).
struct CaseTelemetry {
  double clock_min = 1e300, clock_max = 0, power_max = 0, temperature_max = 0;
  void add(const GpuSample& s) {
    clock_min = std::min(clock_min, s.sm_clock_mhz), clock_max = std::max(clock_max, s.sm_clock_mhz);
    power_max = std::max(power_max, s.power_w), temperature_max = std::max(temperature_max, s.temperature_c);
  }
};

}  // namespace

// prefix_aware_time's config; the JSON keeps it, so that cad_simulate_server_check rebuilds the same plans
// (min_time_gain's default may change; unset, the plugin's own default applies).
nlohmann::json time_config(const Options& opt) {
  nlohmann::json c = {{"rate_table", opt.rate_table}};
  if (opt.min_time_gain >= 0) c["min_time_gain"] = opt.min_time_gain;
  return c;
}

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
    instances.push_back({{"name", "prefix_aware_time"}, {"plugin", "prefix_aware"}, {"config", time_config(opt)}});
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
                        {"time_config", opt.rate_table.empty() ? nlohmann::json() : time_config(opt)},
                        {"batch", given_batch ? "lengths " + opt.lengths : "sampled from " + opt.dist},
                        {"cases", nlohmann::json::array()}};
  Buffers buf;
  buf.how = opt.fill == "constant" ? Fill::kConstant : Fill::kRandom;
  char bus_id[32] = "";
  check(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0), "cudaDeviceGetPCIBusId");
  const NvmlTelemetry nvml(bus_id);
  out["measure_order"] = "interleaved";
  out["telemetry"] = nvml.available() ? "nvml" : "none: " + nvml.reason();
  const auto [cuda_api, cuda_ctx] = host.find<cad_attention_v1_t>("cuda", CAD_PLUGIN_KIND_ATTENTION);
  const Backend backend{cuda_api, cuda_ctx};
  std::printf("GPU: %s; Hq=%d Hkv=%d D=%d bf16 causal, %s data; times: median of %d interleaved rounds\n", prop.name,
              opt.hq, opt.hkv, opt.d, opt.fill.c_str(), opt.reps);
  if (!nvml.available()) std::printf("no clock/power/temperature telemetry (%s)\n", nvml.reason().c_str());
  std::printf("| ranks x tokens | seed | balancer | model max/mean (FLOPs) | predicted time max/mean | fwd max/mean | "
              "bwd max/mean | fwd+bwd max/mean | fwd ms per rank | bwd ms per rank | pack+unpack / attention | "
              "workspace GiB (max rank) | saved GiB per fwd (max) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::vector<std::string> notes;  // one line per case, printed under the table
  for (int64_t ranks : opt.ranks) {
    for (int64_t context : opt.contexts) {
      for (int64_t seed : given_batch ? std::vector<int64_t>{0} : opt.seeds) {
        const auto pieces = batch_of(context, ranks, seed);
        cp::CallShape shape;
        shape.num_q_heads = opt.hq, shape.num_kv_heads = opt.hkv, shape.head_dim = opt.d, shape.bf16 = true;
        shape.causal = true, shape.device_type = CAD_DEVICE_CUDA;
        cad::plan::ModelParams mp;
        mp.num_q_heads = opt.hq, mp.num_kv_heads = opt.hkv, mp.head_dim = opt.d;
        // Every balancer's plan first, then every (balancer, rank) pair, timed together in rounds.
        std::vector<Plan> plans;
        std::vector<cad::plan::PlanStats> models;
        std::vector<double> predicted;  // max/mean of the rate table's predicted fwd+bwd seconds per server
        for (const std::string& balancer : opt.balancers) {
          plans.push_back(make_plan(host, balancer, pieces, shape));
          const Plan& plan = plans.back();
          models.push_back(cad::plan::evaluate_plan(pieces, static_cast<int32_t>(ranks), plan.tasks.data(),
                                                    static_cast<int64_t>(plan.tasks.size()), mp));
          predicted.push_back(opt.rate_table.empty() ? 0 : cad::plan::imbalance_of(cad::plan::server_seconds(
              pieces, static_cast<int32_t>(ranks), plan.tasks.data(), static_cast<int64_t>(plan.tasks.size()), mp, rates)));
        }
        std::vector<Pair> pairs;
        for (const Plan& plan : plans) {
          for (int32_t r = 0; r < ranks; ++r) {
            Pair p;
            p.rank = r;
            p.shape = shape;
            for (const auto& piece : pieces[static_cast<size_t>(r)]) p.shape.tokens += piece.len;
            p.layout = &plan.layout;
            p.batch = &plan.layout.servers[static_cast<size_t>(r)];
            pairs.push_back(std::move(p));
          }
        }
        reserve_batch_buffers(pairs, buf);
        for (Pair& p : pairs) p.facts = rank_facts(*p.layout, p.rank, p.shape, buf, opt.reps);
        size_t free_before = 0, free_after = 0, total = 0;
        check(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo");
        const bool resident = make_resident_plans(backend, pairs);
        check(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo");
        run_rounds(backend, pairs, buf, nvml, opt.reps);
        for (Pair& p : pairs) {
          if (p.plan) backend.api->release_plan(backend.ctx, p.plan), p.plan = nullptr;
        }
        check(cudaDeviceSynchronize(), "releasing the plans");

        const std::string case_name = std::to_string(ranks) + " x " + std::to_string(context / 1024) + "K" +
                                      (given_batch ? std::string() : " seed " + std::to_string(seed));
        CaseTelemetry seen;
        double case_spread_f = 0, case_spread_b = 0;
        for (size_t bi = 0; bi < plans.size(); ++bi) {
          const std::string& balancer = opt.balancers[bi];
          const auto& model = models[bi];
          std::vector<double> fwd, bwd, total_ms;
          double pack = 0, spread_f = 0, spread_b = 0;
          int64_t workspace = 0, saved = 0;
          nlohmann::json per_rank = nlohmann::json::array();
          std::string fwd_list, bwd_list;
          for (int32_t r = 0; r < ranks; ++r) {
            const Pair& p = pairs[bi * static_cast<size_t>(ranks) + static_cast<size_t>(r)];
            const RankResult& rr = p.facts;
            const double f = median(p.fwd_ms), b = median(p.bwd_ms);
            fwd.push_back(f);
            bwd.push_back(b);
            total_ms.push_back(f + b);
            pack = std::max(pack, (rr.pack_fwd_ms + rr.pack_bwd_ms) / std::max(1e-9, f + b));
            spread_f = std::max(spread_f, repeat_spread(p.fwd_ms));
            spread_b = std::max(spread_b, repeat_spread(p.bwd_ms));
            workspace = std::max(workspace, rr.workspace_bytes);
            saved = std::max(saved, rr.saved_bytes);
            char item[64];
            std::snprintf(item, sizeof item, "%s%.2f", r ? " / " : "", f);
            fwd_list += item;
            std::snprintf(item, sizeof item, "%s%.2f", r ? " / " : "", b);
            bwd_list += item;
            nlohmann::json rank_json = {
                {"rank", r}, {"forward_ms", f}, {"backward_ms", b},
                {"pack_unpack_forward_ms", rr.pack_fwd_ms}, {"pack_unpack_backward_ms", rr.pack_bwd_ms},
                {"q_rows", rr.q_rows}, {"kv_rows", rr.kv_rows}, {"segments", rr.segments},
                {"workspace_bytes", rr.workspace_bytes}, {"saved_bytes_per_forward", rr.saved_bytes},
                {"model_score_entries", model.cost[static_cast<size_t>(r)]},
                {"forward_ms_rounds", p.fwd_ms}, {"backward_ms_rounds", p.bwd_ms}};
            if (nvml.available()) {
              rank_json["sm_clock_mhz_rounds"] = sample_rounds(p, [](const GpuSample& s) { return s.sm_clock_mhz; });
              rank_json["power_w_rounds"] = sample_rounds(p, [](const GpuSample& s) { return s.power_w; });
              rank_json["temperature_c_rounds"] = sample_rounds(p, [](const GpuSample& s) { return s.temperature_c; });
              for (size_t i = 0; i < p.after_fwd.size(); ++i) seen.add(p.after_fwd[i]), seen.add(p.after_bwd[i]);
            }
            per_rank.push_back(rank_json);
          }
          case_spread_f = std::max(case_spread_f, spread_f);
          case_spread_b = std::max(case_spread_b, spread_b);
          char predicted_text[32] = "-";
          if (!opt.rate_table.empty()) std::snprintf(predicted_text, sizeof predicted_text, "%.3f", predicted[bi]);
          std::printf("| %lld x %lldK | %s | %s | %.3f | %s | %.3f | %.3f | %.3f | %s | %s | %.2f%% (max rank) | %.2f | %.2f |\n",
                      static_cast<long long>(ranks), static_cast<long long>(context / 1024),
                      given_batch ? "-" : std::to_string(seed).c_str(), balancer.c_str(), model.imbalance,
                      predicted_text,
                      max_over_mean(fwd), max_over_mean(bwd), max_over_mean(total_ms), fwd_list.c_str(), bwd_list.c_str(),
                      100.0 * pack, static_cast<double>(workspace) / (1 << 30), static_cast<double>(saved) / (1 << 30));
          nlohmann::json case_json = {
              {"ranks", ranks}, {"context", context}, {"seed", seed}, {"balancer", balancer},
              {"model_imbalance", model.imbalance}, {"predicted_time_imbalance", predicted[bi]},
              {"forward_imbalance", max_over_mean(fwd)}, {"backward_imbalance", max_over_mean(bwd)},
              {"total_imbalance", max_over_mean(total_ms)}, {"max_pack_unpack_share", pack},
              {"bytes_moved_forward", model.total_bytes}, {"plan_ms_host", plans[bi].plan_ms},
              {"measure_order", "interleaved"}, {"rounds", opt.reps}, {"plans", resident ? "resident" : "per_pair"},
              {"repeat_spread_forward", spread_f}, {"repeat_spread_backward", spread_b}, {"ranks_detail", per_rank}};
          out["cases"].push_back(case_json);
        }
        std::fflush(stdout);
        // The case's noise floor and what the GPU did meanwhile, for the note under the table.
        char plans_text[96] = "plans made per batch in each round (resident ones did not fit)";
        if (resident) {
          std::snprintf(plans_text, sizeof plans_text, "resident plans (%.1f GiB of device memory)",
                        static_cast<double>(free_before > free_after ? free_before - free_after : 0) / (1 << 30));
        }
        char note[320];
        const int at = std::snprintf(note, sizeof note, "%s: %zu batches, %s; repeat spread max fwd %.1f%%, bwd %.1f%%",
                                     case_name.c_str(), pairs.size(), plans_text, 100 * case_spread_f,
                                     100 * case_spread_b);
        if (nvml.available() && seen.clock_max > 0) {
          std::snprintf(note + at, sizeof note - static_cast<size_t>(at),
                        "; SM clock %.0f-%.0f MHz, power max %.0f W, temperature max %.0f C", seen.clock_min,
                        seen.clock_max, seen.power_max, seen.temperature_max);
          for (size_t i = out["cases"].size() - plans.size(); i < out["cases"].size(); ++i) {
            out["cases"][i]["case_telemetry"] = {{"sm_clock_mhz_min", seen.clock_min}, {"sm_clock_mhz_max", seen.clock_max},
                                                 {"power_w_max", seen.power_max}, {"temperature_c_max", seen.temperature_max}};
          }
        }
        notes.push_back(note);
      }
    }
  }
  std::printf("\nPer case (all balancers' batches timed together; a time is the median of its %d rounds; repeat spread:\n"
              "(max - min) / median of a batch's rounds, the largest over the case's batches, fwd and bwd):\n", opt.reps);
  for (const std::string& n : notes) std::printf("- %s\n", n.c_str());
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
