// cad_gpu_test.cpp -- CAD on CUDA tensors, on ONE GPU (not run by CI; tests/gpu_cad/run.sh runs it):
//   mpirun -np N cad_gpu_cad_tests            N processes share the GPU, host-staged over the mpi communicator
//   mpirun -np 1 cad_gpu_cad_tests --nccl     NCCL with one rank (the graph-capture test needs it)
//   ... --nccl --copy-engines                  the nccl communicator's all-to-alls by the copy engines (2+ ranks)
// Every rank builds the same random global batch (documents cut across ranks, odd lengths, empty ranks),
// runs CAD forward and backward on its own pieces (bf16, GQA, head dims 64 and 128, causal and not, every
// balancer, keep and re-send modes, with and without a plan), and compares O, LSE, dQ, dK, dV of its tokens
// with (a) the local CUDA backend over the whole batch on the same GPU and (b) the CPU oracle in fp32 on the
// same bf16 inputs. Bad calls must fail on every rank with a message naming the tensor or rank.
#include <cuda_runtime.h>
#include <mpi.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cad/cad_host.hpp"
#include "device_scope.h"
#include "reference_math.h"
#include "test_batch.h"

using cad_test::BatchSpec;
using cad_test::GlobalBatch;

namespace {

int g_rank = 0, g_world = 1;
int g_device = 0;  // rank % visible GPUs: one GPU per rank where there are enough, else shared
bool g_nccl = false;
bool g_copy_engines = false;  // --copy-engines: the nccl communicator's config copy_engines
int64_t g_timeout_ms = 60000;
std::string g_fault;  // CAD_TEST_FAULT: "skip" (rank 1 skips a forward) or "kill" (rank 1 exits mid-step)
cad::Host* g_host = nullptr;

// The test host's CUDA memory (options.device_allocate / device_free): cudaMallocAsync on the plugin's stream,
// except that a test can make this rank's next allocations fail, as a GPU out of memory does.
std::atomic<int> g_failing_allocations{0};

cad_status_t test_allocate(void*, int32_t device_id, size_t bytes, void* stream, void** out) {
  if (g_failing_allocations.load() > 0) {
    --g_failing_allocations;
    return CAD_STATUS_OUT_OF_MEMORY;
  }
  const cad::kernels::DeviceScope scope(device_id);
  if (scope.error() != cudaSuccess) return CAD_STATUS_DEVICE_ERROR;
  const cudaError_t e = cudaMallocAsync(out, bytes, static_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) return CAD_STATUS_OK;
  cudaGetLastError();
  return e == cudaErrorMemoryAllocation ? CAD_STATUS_OUT_OF_MEMORY : CAD_STATUS_DEVICE_ERROR;
}

void test_free(void*, int32_t device_id, void* ptr, size_t, void* stream) {
  const cad::kernels::DeviceScope scope(device_id);
  cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
}

std::vector<std::string> balancers() {
  std::vector<std::string> names;
  std::stringstream list(CAD_TEST_BALANCERS);
  for (std::string name; std::getline(list, name, ',');) names.push_back(name);
  return names;
}

// `groups`: the instance's head_groups (the batches' Hq = 8, Hkv = 2 divide by 2).
std::string cad_name(const std::string& balancer, bool keep, int groups = 1) {
  return "cad_" + balancer + (keep ? "_keep" : "_resend") + (groups > 1 ? "_hg" + std::to_string(groups) : "");
}

std::string stack_config() {
  nlohmann::json instances = nlohmann::json::array();
  if (g_nccl) {
    instances.push_back({{"name", "comm"}, {"plugin", "nccl"},
                         {"config", {{"timeout_ms", g_timeout_ms}, {"bootstrap", "mpi"}, {"device", g_device},
                                     {"copy_engines", g_copy_engines}}}});
  } else {
    instances.push_back({{"name", "comm"}, {"plugin", "mpi"}, {"config", {{"timeout_ms", g_timeout_ms}}}});
  }
  instances.push_back({{"name", "server"}, {"plugin", "cuda"}, {"config", {{"device", g_device}}}});
  // What the Python package gives the own tasks on GPUs (cad.init(own_tasks_in_place=True)): a cuda instance whose
  // forward leaves 16 SMs to the collective and walks its units dynamically.
  instances.push_back({{"name", "server_own"},
                       {"plugin", "cuda"},
                       {"config", {{"device", g_device}, {"reserve_sms", 16}, {"forward_walk", "dynamic"}}}});
  for (const std::string& b : balancers()) {
    instances.push_back({{"name", "bal_" + b}, {"plugin", b}, {"config", nlohmann::json::object()}});
    // The keep instances also run the tasks on a rank's own documents in place (own_tasks_in_place, off by default:
    // the resend ones keep the default), so every test here covers both data paths; each also with its heads in
    // two pipelined groups (head_groups; over NCCL only, the host-staged path runs them unsplit), and in three,
    // which do not divide the batches' heads (refused at the plan).
    for (bool keep : {true, false}) {
      for (int groups : {1, 2, 3}) {
        nlohmann::json config = {{"communicator", "comm"}, {"balancer", "bal_" + b}, {"server_backend", "server"},
                                 {"keep_forward_tensors", keep}, {"own_tasks_in_place", keep},
                                 {"head_groups", groups}};
        if (keep) config["own_server_backend"] = "server_own";
        instances.push_back({{"name", cad_name(b, keep, groups)}, {"plugin", "cad"}, {"config", config}});
      }
    }
  }
  return nlohmann::json{{"log_level", "warn"}, {"instances", instances}}.dump();
}

struct Api {
  const cad_attention_v1_t* table;
  void* ctx;
  std::string error() const { return table->last_error(ctx); }
};

Api instance(const std::string& name) {
  const auto found = g_host->find<cad_attention_v1_t>(name, CAD_PLUGIN_KIND_ATTENTION);
  return Api{found.first, found.second};
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device tensor (bf16 or fp32) with its descriptor.
struct DeviceTensor {
  std::vector<int64_t> shape;
  bool bf16 = true;
  void* ptr = nullptr;
  cad_tensor_v1_t view{};
  DeviceTensor(std::vector<int64_t> dims, bool is_bf16) : shape(std::move(dims)), bf16(is_bf16) {
    check(cudaMalloc(&ptr, std::max<size_t>(bytes(), 16)), "cudaMalloc");
    check(cudaMemset(ptr, 0x7f, std::max<size_t>(bytes(), 16)), "cudaMemset");  // a sentinel: unwritten rows show
  }
  ~DeviceTensor() { cudaFree(ptr); }
  DeviceTensor(const DeviceTensor&) = delete;
  int64_t numel() const { int64_t n = 1; for (int64_t d : shape) n *= d; return n; }
  size_t bytes() const { return static_cast<size_t>(numel()) * (bf16 ? 2 : 4); }
  cad_tensor_v1_t* desc() {
    view = cad_tensor_v1_t{ptr, {CAD_DEVICE_CUDA, g_device}, static_cast<int32_t>(shape.size()),
                           bf16 ? cad_dtype_v1_t{CAD_DTYPE_CODE_BFLOAT, 16, 1} : cad_dtype_v1_t{CAD_DTYPE_CODE_FLOAT, 32, 1},
                           shape.data(), nullptr, 0};
    return &view;
  }
  void upload(const std::vector<float>& values) {
    if (bf16) {
      std::vector<uint16_t> h(values.size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = cad_test::to_bf16(values[i]);
      check(cudaMemcpy(ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice), "upload");
    } else {
      check(cudaMemcpy(ptr, values.data(), values.size() * 4, cudaMemcpyHostToDevice), "upload");
    }
  }
  std::vector<float> download() const {
    std::vector<float> out(static_cast<size_t>(numel()));
    if (bf16) {
      std::vector<uint16_t> h(out.size());
      check(cudaMemcpy(h.data(), ptr, h.size() * 2, cudaMemcpyDeviceToHost), "download");
      for (size_t i = 0; i < h.size(); ++i) out[i] = cad_test::from_bf16(h[i]);
    } else {
      check(cudaMemcpy(out.data(), ptr, out.size() * 4, cudaMemcpyDeviceToHost), "download");
    }
    return out;
  }
};

struct Results {
  std::vector<float> o, lse, d_q, d_k, d_v;
};

// One rank's (or the whole batch's) call: inputs uploaded, outputs allocated.
struct Call {
  int64_t tokens, hq, hkv, d;
  DeviceTensor q, k, v, d_o, o, lse, d_q, d_k, d_v;
  std::vector<cad_piece_v1_t> pieces;
  std::vector<cad_segment_v1_t> segments;
  bool causal = true;
  float scale = 0.125f;
  cudaStream_t stream = nullptr;

  Call(const GlobalBatch& b, const std::vector<int64_t>& rows, bool is_causal)
      : tokens(static_cast<int64_t>(rows.size())), hq(b.hq), hkv(b.hkv), d(b.d),
        q({tokens, hq, d}, true), k({tokens, hkv, d}, true), v({tokens, hkv, d}, true), d_o({tokens, hq, d}, true),
        o({tokens, hq, d}, true), lse({hq, tokens}, false), d_q({tokens, hq, d}, true), d_k({tokens, hkv, d}, true),
        d_v({tokens, hkv, d}, true), causal(is_causal), scale(1.0f / std::sqrt(static_cast<float>(b.d))) {
    q.upload(cad_test::take_rows(b.q, hq * d, rows));
    k.upload(cad_test::take_rows(b.k, hkv * d, rows));
    v.upload(cad_test::take_rows(b.v, hkv * d, rows));
    d_o.upload(cad_test::take_rows(b.d_o, hq * d, rows));
  }
  // This rank's call: its rows and pieces.
  Call(const GlobalBatch& b, bool is_causal) : Call(b, b.global_rows(g_rank), is_causal) {
    pieces = b.pieces[static_cast<size_t>(g_rank)];
  }

  cad_attention_forward_args_v1_t forward_args(void* plan, void** saved) {
    cad_attention_forward_args_v1_t a{};
    a.struct_size = sizeof(a);
    a.pieces = plan != nullptr ? nullptr : pieces.data();
    a.num_pieces = plan != nullptr ? 0 : static_cast<int64_t>(pieces.size());
    a.segments = segments.empty() ? nullptr : segments.data();
    a.num_segments = static_cast<int64_t>(segments.size());
    a.softmax_scale = scale;
    a.causal = causal ? 1 : 0;
    a.stream = stream;
    a.q = q.desc(), a.k = k.desc(), a.v = v.desc(), a.o = o.desc(), a.lse = lse.desc();
    a.plan = plan;
    a.saved = saved;
    return a;
  }
  cad_attention_backward_args_v1_t backward_args(void* plan, void* saved) {
    cad_attention_backward_args_v1_t a{};
    a.struct_size = sizeof(a);
    a.pieces = plan != nullptr ? nullptr : pieces.data();
    a.num_pieces = plan != nullptr ? 0 : static_cast<int64_t>(pieces.size());
    a.segments = segments.empty() ? nullptr : segments.data();
    a.num_segments = static_cast<int64_t>(segments.size());
    a.softmax_scale = scale;
    a.causal = causal ? 1 : 0;
    a.stream = stream;
    a.q = q.desc(), a.k = k.desc(), a.v = v.desc(), a.o = o.desc(), a.lse = lse.desc();
    a.d_o = d_o.desc(), a.d_q = d_q.desc(), a.d_k = d_k.desc(), a.d_v = d_v.desc();
    a.plan = plan;
    a.saved = saved;
    return a;
  }
  cad_status_t forward(const Api& api, void* plan = nullptr, void** saved = nullptr) {
    auto a = forward_args(plan, saved);
    return api.table->forward(api.ctx, &a);
  }
  cad_status_t backward(const Api& api, void* plan = nullptr, void* saved = nullptr) {
    auto a = backward_args(plan, saved);
    return api.table->backward(api.ctx, &a);
  }
  Results results() const {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return Results{o.download(), lse.download(), d_q.download(), d_k.download(), d_v.download()};
  }
};

cad_status_t make_plan(const Api& api, const Call& call, void** plan) {
  cad_attention_plan_args_v1_t a{};
  a.struct_size = sizeof(a);
  a.pieces = call.pieces.data();
  a.num_pieces = static_cast<int64_t>(call.pieces.size());
  a.num_q_heads = static_cast<int32_t>(call.hq);
  a.num_kv_heads = static_cast<int32_t>(call.hkv);
  a.head_dim = static_cast<int32_t>(call.d);
  a.dtype = {CAD_DTYPE_CODE_BFLOAT, 16, 1};
  a.causal = call.causal ? 1 : 0;
  a.device = {CAD_DEVICE_CUDA, g_device};
  a.stream = call.stream;
  return api.table->make_plan(api.ctx, &a, plan);
}

BatchSpec spec(uint64_t seed, int64_t d) {
  BatchSpec s;
  s.seed = seed;
  s.world = g_world;
  s.tokens_per_rank = 301;  // odd: odd document lengths and cuts
  s.hq = 8;
  s.hkv = 2;
  s.d = d;
  return s;
}

// The batch's inputs as the GPU sees them (bf16), so the oracle computes on the same numbers.
GlobalBatch rounded(GlobalBatch b) {
  for (auto* t : {&b.q, &b.k, &b.v, &b.d_o}) {
    for (float& x : *t) x = cad_test::from_bf16(cad_test::to_bf16(x));
  }
  return b;
}

std::vector<int64_t> all_rows(const GlobalBatch& b) {
  std::vector<int64_t> rows(static_cast<size_t>(b.total_tokens));
  for (int64_t i = 0; i < b.total_tokens; ++i) rows[static_cast<size_t>(i)] = i;
  return rows;
}

// (a) the local CUDA backend over the whole batch (one segment per document), this rank's rows.
Results local_cuda(const GlobalBatch& b, bool causal) {
  Call whole(b, all_rows(b), causal);
  for (const auto& doc : b.docs) whole.segments.push_back({doc.first_row, doc.len, doc.first_row, doc.len});
  const Api api = instance("server");
  EXPECT_EQ(whole.forward(api), CAD_STATUS_OK) << api.error();
  EXPECT_EQ(whole.backward(api), CAD_STATUS_OK) << api.error();
  const Results all = whole.results();
  const std::vector<int64_t> rows = b.global_rows(g_rank);
  return Results{cad_test::take_rows(all.o, b.hq * b.d, rows), cad_test::take_columns(all.lse, b.hq, b.total_tokens, rows),
                 cad_test::take_rows(all.d_q, b.hq * b.d, rows), cad_test::take_rows(all.d_k, b.hkv * b.d, rows),
                 cad_test::take_rows(all.d_v, b.hkv * b.d, rows)};
}

// (b) the CPU oracle in fp32 over the bf16 inputs, with the GPU's bf16 O as the backward's O.
Results oracle(const GlobalBatch& b, bool causal, float scale) {
  std::vector<cad_segment_v1_t> segments;
  for (const auto& doc : b.docs) segments.push_back({doc.first_row, doc.len, doc.first_row, doc.len});
  cad::reference::AttentionBatch batch;
  batch.tq = batch.tk = b.total_tokens;
  batch.hq = b.hq, batch.hkv = b.hkv, batch.d = b.d;
  batch.segments = segments.data();
  batch.num_segments = static_cast<int64_t>(segments.size());
  batch.softmax_scale = scale;
  batch.causal = causal;
  Results r;
  r.o.resize(b.q.size()), r.lse.resize(static_cast<size_t>(b.hq * b.total_tokens));
  r.d_q.resize(b.q.size()), r.d_k.resize(b.k.size()), r.d_v.resize(b.v.size());
  cad::reference::attention_forward(batch, b.q.data(), b.k.data(), b.v.data(), r.o.data(), r.lse.data(), 4);
  cad::reference::attention_backward(batch, b.q.data(), b.k.data(), b.v.data(), r.o.data(), r.lse.data(), b.d_o.data(),
                                     r.d_q.data(), r.d_k.data(), r.d_v.data(), 4);
  const std::vector<int64_t> rows = b.global_rows(g_rank);
  return Results{cad_test::take_rows(r.o, b.hq * b.d, rows), cad_test::take_columns(r.lse, b.hq, b.total_tokens, rows),
                 cad_test::take_rows(r.d_q, b.hq * b.d, rows), cad_test::take_rows(r.d_k, b.hkv * b.d, rows),
                 cad_test::take_rows(r.d_v, b.hkv * b.d, rows)};
}

double worst_error = 0.0;

void expect_close(const Results& got, const Results& want, const std::string& against, double tol = 2e-2) {
  const std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>> pairs[] = {
      {"O", {&got.o, &want.o}}, {"LSE", {&got.lse, &want.lse}}, {"dQ", {&got.d_q, &want.d_q}},
      {"dK", {&got.d_k, &want.d_k}}, {"dV", {&got.d_v, &want.d_v}}};
  for (const auto& [name, p] : pairs) {
    if (p.first->empty() && p.second->empty()) continue;
    const double err = cad_test::relative_error(*p.first, *p.second);
    worst_error = std::max(worst_error, err);
    EXPECT_LE(err, tol) << "rank " << g_rank << ": " << name << " against " << against << ": relative error " << err;
  }
}

bool same_on_every_rank(const std::string& text) {
  std::vector<char> mine(1024, '\0'), all(1024 * static_cast<size_t>(g_world));
  std::strncpy(mine.data(), text.c_str(), mine.size() - 1);
  MPI_Allgather(mine.data(), 1024, MPI_CHAR, all.data(), 1024, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < g_world; ++r) {
    if (std::strncmp(all.data() + 1024 * r, mine.data(), 1024) != 0) return false;
  }
  return true;
}


}  // namespace

// Every balancer, both masks, keep and re-send, head dims 64 and 128, one-shot calls and planned calls, heads
// unsplit and in two groups.
TEST(CadGpu, MatchesLocalCudaAndTheOracle) {
  uint64_t seed = 500;
  for (int64_t d : {64, 128}) {
    for (bool causal : {true, false}) {
      const GlobalBatch b = rounded(cad_test::make_batch(spec(++seed, d)));
      const Results local = local_cuda(b, causal);
      Call probe(b, causal);
      const Results want = oracle(b, causal, probe.scale);
      expect_close(local, want, "oracle (local cuda backend)");
      for (const std::string& balancer : balancers()) {
        for (bool keep : {true, false}) {
          for (int groups : {1, 2}) {
            for (bool planned : {false, true}) {
              SCOPED_TRACE(balancer + " D=" + std::to_string(d) + (causal ? " causal" : " full") +
                           (keep ? " keep" : " resend") + (planned ? " planned" : " one-shot") +
                           (groups > 1 ? " 2 head groups" : ""));
              const Api api = instance(cad_name(balancer, keep, groups));
              Call call(b, causal);
              void* plan = nullptr;
              void* saved = nullptr;
              if (planned) {
                ASSERT_EQ(make_plan(api, call, &plan), CAD_STATUS_OK) << api.error();
              }
              ASSERT_EQ(call.forward(api, plan, planned ? &saved : nullptr), CAD_STATUS_OK) << api.error();
              ASSERT_EQ(call.backward(api, plan, saved), CAD_STATUS_OK) << api.error();
              api.table->release_saved(api.ctx, saved);
              api.table->release_plan(api.ctx, plan);
              const Results got = call.results();
              expect_close(got, local, "the local cuda backend");
              expect_close(got, want, "the CPU oracle");
            }
          }
        }
      }
    }
  }
  if (g_rank == 0) std::printf("[cad_gpu] worst relative error over all cases: %.3g\n", worst_error);
}

// dK/dV partial sums are added in rank order: two runs give the same bits.
TEST(CadGpu, BitwiseReproducible) {
  const GlobalBatch b = rounded(cad_test::make_batch(spec(600, 128)));
  const Api api = instance(cad_name(balancers().back(), false));
  std::vector<Results> runs;
  for (int i = 0; i < 2; ++i) {
    Call call(b, true);
    ASSERT_EQ(call.forward(api), CAD_STATUS_OK) << api.error();
    ASSERT_EQ(call.backward(api), CAD_STATUS_OK) << api.error();
    runs.push_back(call.results());
  }
  EXPECT_EQ(runs[0].d_k, runs[1].d_k);
  EXPECT_EQ(runs[0].d_v, runs[1].d_v);
  EXPECT_EQ(runs[0].o, runs[1].o);
}

// Heads in two pipelined groups compute every head as the unsplit call does: O and LSE bit for bit (each head's
// forward is the same arithmetic whatever the other heads), the gradients within the tolerance of the other tests
// (the backward's dQ adds tiles in the order they finish).
TEST(CadGpu, HeadGroupsGiveTheUnsplitResults) {
  if (!g_nccl) GTEST_SKIP() << "head groups are pipelined on the nccl communicator only";
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep" : "resend");
    const GlobalBatch b = rounded(cad_test::make_batch(spec(650, 128)));
    std::vector<Results> runs;
    for (int groups : {1, 2}) {
      const Api api = instance(cad_name(balancers().back(), keep, groups));
      Call call(b, true);
      void* plan = nullptr;
      void* saved = nullptr;
      ASSERT_EQ(make_plan(api, call, &plan), CAD_STATUS_OK) << api.error();
      ASSERT_EQ(call.forward(api, plan, &saved), CAD_STATUS_OK) << api.error();
      ASSERT_EQ(call.backward(api, plan, saved), CAD_STATUS_OK) << api.error();
      api.table->release_saved(api.ctx, saved);
      api.table->release_plan(api.ctx, plan);
      runs.push_back(call.results());
    }
    EXPECT_EQ(runs[0].o, runs[1].o);
    EXPECT_EQ(runs[0].lse, runs[1].lse);
    expect_close(runs[1], runs[0], "the unsplit call", 1e-2);
  }
}

namespace {
nlohmann::json stats_of(const Api& api) {
  std::string text(1 << 16, '\0');
  size_t needed = 0;
  EXPECT_EQ(api.table->get_stats_json(api.ctx, text.data(), text.size(), &needed), CAD_STATUS_OK) << api.error();
  text.resize(std::min(needed, text.size()));
  while (!text.empty() && text.back() == '\0') text.pop_back();
  return nlohmann::json::parse(text);
}
}  // namespace

// get_stats_json's gpu_calls: once the GPU finished them, every forward and backward is counted, with the server
// backend's compute inside each call's time (the tasks run in place and every head group included); the ranks'
// server compute adds up to more than nothing.
TEST(CadGpu, CallTimesCountEveryCall) {
  for (int groups : {1, 2}) {
    if (groups > 1 && !g_nccl) continue;  // head groups are pipelined on the nccl communicator only
    for (bool keep : {true, false}) {
      SCOPED_TRACE(std::string(keep ? "keep" : "resend") + ", head groups " + std::to_string(groups));
      const GlobalBatch b = rounded(cad_test::make_batch(spec(680, 128)));
      const Api api = instance(cad_name(balancers().back(), keep, groups));
      Call call(b, true);
      void* plan = nullptr;
      ASSERT_EQ(make_plan(api, call, &plan), CAD_STATUS_OK) << api.error();
      check(cudaDeviceSynchronize(), "sync");
      const nlohmann::json before = stats_of(api).value("gpu_calls", nlohmann::json::object());
      constexpr int kSteps = 3;
      for (int i = 0; i < kSteps; ++i) {
        void* saved = nullptr;
        ASSERT_EQ(call.forward(api, plan, &saved), CAD_STATUS_OK) << api.error();
        ASSERT_EQ(call.backward(api, plan, saved), CAD_STATUS_OK) << api.error();
        api.table->release_saved(api.ctx, saved);
      }
      check(cudaDeviceSynchronize(), "sync");
      const nlohmann::json after = stats_of(api).at("gpu_calls");
      const auto delta = [&](const char* key) { return after.at(key).get<double>() - before.value(key, 0.0); };
      EXPECT_EQ(delta("forwards"), kSteps) << "rank " << g_rank << ": " << after.dump();
      EXPECT_EQ(delta("backwards"), kSteps) << "rank " << g_rank << ": " << after.dump();
      EXPECT_EQ(after.at("pending").get<int64_t>(), 0) << "rank " << g_rank;
      for (const char* pass : {"forward", "backward"}) {
        const double call_ms = delta((std::string(pass) + "_ms").c_str());
        const double server_ms = delta((std::string(pass) + "_server_ms").c_str());
        EXPECT_GE(server_ms, 0.0) << "rank " << g_rank << " " << pass;
        EXPECT_GE(call_ms * 1.001 + 1e-3, server_ms) << "rank " << g_rank << " " << pass << ": " << after.dump();
        double all_server_ms = 0.0;
        MPI_Allreduce(&server_ms, &all_server_ms, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        EXPECT_GT(all_server_ms, 0.0) << pass;
      }
      api.table->release_plan(api.ctx, plan);
    }
  }
}

// A head_groups that does not divide the call's heads is refused on every rank at the plan, naming the key.
TEST(CadGpu, HeadGroupsThatDoNotDivideTheHeadsAreRefused) {
  if (!g_nccl) GTEST_SKIP() << "head groups are pipelined on the nccl communicator only";
  const GlobalBatch b = rounded(cad_test::make_batch(spec(660, 64)));
  const Api api = instance(cad_name(balancers().back(), false, 3));
  Call call(b, true);
  void* plan = nullptr;
  EXPECT_EQ(make_plan(api, call, &plan), CAD_STATUS_INVALID_CONFIG);
  EXPECT_NE(api.error().find("head_groups 3 does not divide the call's heads (Hq=8, Hkv=2)"), std::string::npos)
      << api.error();
  EXPECT_EQ(plan, nullptr);
}

// With a plan and NCCL, a layer's forward and backward are only enqueued (head groups too: their exchanges are
// joined by events, their buffers taken and given back in stream order): capture them into a CUDA graph,
// replay it, and get the eager results bit for bit -- except dQ: the sm_90a backward adds every key tile's dQ
// into an fp32 accumulator with TMA reductions, in the order the tiles finish, so dQ is equal up to that
// order's rounding (at most one bf16 step of each element; BitwiseReproducible leaves it out too). On 4 GPUs
// one rank's replayed dQ was not bitwise equal (2026-11-26; the size of the difference was not printed then:
// this check bounds it).
TEST(CadGpu, GraphReplayGivesTheEagerResults) {
  if (!g_nccl) GTEST_SKIP() << "host-staged exchanges synchronise the stream: graphs need the nccl communicator";
  for (const auto& [keep, groups] : {std::pair{true, 1}, std::pair{false, 1}, std::pair{true, 2}, std::pair{false, 2}}) {
    SCOPED_TRACE(std::string(keep ? "keep" : "resend") + (groups > 1 ? ", 2 head groups" : ""));
    const GlobalBatch b = rounded(cad_test::make_batch(spec(700, 128)));
    const Api api = instance(cad_name(balancers().back(), keep, groups));
    Call call(b, true);
    check(cudaStreamCreateWithFlags(&call.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    void* plan = nullptr;
    ASSERT_EQ(make_plan(api, call, &plan), CAD_STATUS_OK) << api.error();
    void* saved = nullptr;
    ASSERT_EQ(call.forward(api, plan, keep ? &saved : nullptr), CAD_STATUS_OK) << api.error();
    ASSERT_EQ(call.backward(api, plan, saved), CAD_STATUS_OK) << api.error();
    api.table->release_saved(api.ctx, saved);
    const Results eager = call.results();

    for (DeviceTensor* t : {&call.o, &call.lse, &call.d_q, &call.d_k, &call.d_v}) check(cudaMemset(t->ptr, 0, t->bytes()), "memset");
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(call.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    saved = nullptr;
    const cad_status_t fs = call.forward(api, plan, keep ? &saved : nullptr);
    const cad_status_t bs = fs == CAD_STATUS_OK ? call.backward(api, plan, saved) : fs;
    api.table->release_saved(api.ctx, saved);
    const cudaError_t ended = cudaStreamEndCapture(call.stream, &graph);
    ASSERT_EQ(fs, CAD_STATUS_OK) << api.error();
    ASSERT_EQ(bs, CAD_STATUS_OK) << api.error();
    ASSERT_EQ(ended, cudaSuccess) << cudaGetErrorString(ended);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 3; ++replay) ASSERT_EQ(cudaGraphLaunch(exec, call.stream), cudaSuccess);
    check(cudaStreamSynchronize(call.stream), "replay");
    const Results replayed = call.results();
    EXPECT_EQ(replayed.o, eager.o);
    EXPECT_EQ(replayed.lse, eager.lse);
    EXPECT_LE(cad_test::relative_error(replayed.d_q, eager.d_q), 1.0 / 128) << "rank " << g_rank;
    EXPECT_EQ(replayed.d_k, eager.d_k);
    EXPECT_EQ(replayed.d_v, eager.d_v);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    api.table->release_plan(api.ctx, plan);
    cudaStreamDestroy(call.stream);
  }
}

namespace {
void expect_refused(const Api& api, cad_status_t status, const std::string& message, const char* needle) {
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << message;
  EXPECT_NE(message.find(needle), std::string::npos) << "rank " << g_rank << ": '" << message << "' lacks '" << needle << "'";
  if (!g_nccl) {
    EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << ": " << message;
  }
  (void)api;
}
}  // namespace

TEST(CadGpu, BadCallsAreRefusedOnEveryRank) {
  const GlobalBatch b = rounded(cad_test::make_batch(spec(800, 64)));
  const Api api = instance(cad_name(balancers().front(), false));
  {  // a CPU tensor on the last rank
    Call call(b, true);
    std::vector<uint16_t> host(static_cast<size_t>(call.q.numel()));
    cad_attention_forward_args_v1_t a = call.forward_args(nullptr, nullptr);
    cad_tensor_v1_t cpu_q = *call.q.desc();
    if (g_rank == g_world - 1) {
      cpu_q.data = host.data();
      cpu_q.device = {CAD_DEVICE_CPU, 0};
      a.q = &cpu_q;
    }
    const cad_status_t st = api.table->forward(api.ctx, &a);
    expect_refused(api, st, api.error(), "'q'");
  }
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices > 1) {  // a stream of another GPU (only where there is one)
    Call call(b, true);
    cudaStream_t other = nullptr;
    cudaSetDevice((g_device + 1) % devices);
    check(cudaStreamCreate(&other), "cudaStreamCreate");
    cudaSetDevice(g_device);
    if (g_rank == 0) call.stream = other;
    const cad_status_t st = call.forward(api);
    expect_refused(api, st, api.error(), "stream");
    cudaStreamDestroy(other);
  } else if (g_rank == 0) {
    std::printf("[cad_gpu] wrong-stream refusal not exercised: one GPU\n");
  }
  void* plan = nullptr;
  Call call(b, true);
  ASSERT_EQ(make_plan(api, call, &plan), CAD_STATUS_OK) << api.error();
  {  // a plan from another micro-batch
    BatchSpec other = spec(801, 64);
    other.tokens_per_rank += 7;
    const GlobalBatch c = rounded(cad_test::make_batch(other));
    Call wrong(c, true);
    const cad_status_t st = wrong.forward(api, plan);
    expect_refused(api, st, api.error(), "another micro-batch");
  }
  {  // the plan still serves its own batch
    EXPECT_EQ(call.forward(api, plan), CAD_STATUS_OK) << api.error();
    EXPECT_EQ(call.backward(api, plan), CAD_STATUS_OK) << api.error();
  }
  api.table->release_plan(api.ctx, plan);
  {  // mismatched pieces: rank 0 claims a longer first document
    Call bad(b, true);
    if (g_rank == 0 && !bad.pieces.empty()) bad.pieces[0].doc_len += 1;
    void* p = nullptr;
    const cad_status_t st = make_plan(api, bad, &p);
    if (!b.pieces[0].empty()) {
      expect_refused(api, st, api.error(), "document");
    }
    api.table->release_plan(api.ctx, p);
  }
}

// A rank that cannot allocate its kept server tensors (out of memory, before any exchange) reports
// OUT_OF_MEMORY naming them, after running the call's exchanges drained: its peers finish the call instead of
// waiting for the communicator's timeout (on 4 GPUs they waited 120 s before the drain), and the next step
// works on every rank. (Peers' outputs for the rows that rank serves are not valid; the call failed.)
TEST(CadGpu, OutOfMemoryForKeptTensorsDrainsTheExchanges) {
  const GlobalBatch b = rounded(cad_test::make_batch(spec(950, 64)));
  const Api api = instance(cad_name(balancers().front(), true));
  Call call(b, true);
  void* plan = nullptr;
  ASSERT_EQ(make_plan(api, call, &plan), CAD_STATUS_OK) << api.error();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const int failing = g_world - 1;
  if (g_rank == failing) g_failing_allocations = 1;  // the forward's first allocation: the kept server Q
  void* saved = nullptr;
  const auto start = std::chrono::steady_clock::now();
  const cad_status_t st = call.forward(api, plan, &saved);
  const std::string message = api.error();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // NCCL: the drained collectives complete
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  g_failing_allocations = 0;
  if (g_rank == failing) {
    EXPECT_EQ(st, CAD_STATUS_OUT_OF_MEMORY) << message;
    EXPECT_NE(message.find("kept server"), std::string::npos) << message;
    EXPECT_EQ(saved, nullptr);
  } else {
    EXPECT_EQ(st, CAD_STATUS_OK) << message;
  }
  EXPECT_LT(s, g_timeout_ms / 2000.0) << "rank " << g_rank << ": the call waited for the timeout, not drained";
  api.table->release_saved(api.ctx, saved);
  saved = nullptr;
  EXPECT_EQ(call.forward(api, plan, &saved), CAD_STATUS_OK) << api.error();
  EXPECT_EQ(call.backward(api, plan, saved), CAD_STATUS_OK) << api.error();
  api.table->release_saved(api.ctx, saved);
  api.table->release_plan(api.ctx, plan);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

// Faults (CAD_TEST_FAULT set; tests/multi_gpu/run.sh and tests/gpu_cad/run.sh run them in their own jobs):
// rank 1 skips a call or dies mid-step; every other rank must get an error naming the operation within
// the communicator's timeout (3 s here) plus a margin, and exit -- never hang.
TEST(CadGpuFault, SurvivorsFailInBoundedTime) {
  if (g_fault.empty()) GTEST_SKIP() << "set CAD_TEST_FAULT=skip or kill";
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks or more";
  const GlobalBatch b = rounded(cad_test::make_batch(spec(900, 64)));
  const Api api = instance(cad_name(balancers().back(), false));
  Call call(b, true);
  void* plan = nullptr;
  ASSERT_EQ(make_plan(api, call, &plan), CAD_STATUS_OK) << api.error();
  ASSERT_EQ(call.forward(api, plan), CAD_STATUS_OK) << api.error();  // one good step first
  check(cudaDeviceSynchronize(), "sync");
  if (g_rank == 1) {
    if (g_fault == "kill") std::_Exit(9);  // dies mid-step, MPI and NCCL state left as they are
    std::fprintf(stderr, "[rank 1] skipping the forward on purpose\n");
    std::fflush(stderr);
    // Skipped the call; stays alive well past the peers' timeout (they must not wait for it), then leaves.
    std::this_thread::sleep_for(std::chrono::milliseconds(g_timeout_ms + 8000));
    std::_Exit(0);
  }
  const auto start = std::chrono::steady_clock::now();
  cad_status_t status = call.forward(api, plan);
  if (status == CAD_STATUS_OK) {
    // NCCL: enqueued; the watchdog aborts the communicator at the deadline and the stream drains.
    cudaDeviceSynchronize();
    status = call.forward(api, plan);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "[rank %d] after rank 1's fault ('%s'): status %s in %.1f s: %s\n", g_rank, g_fault.c_str(),
               cad_status_name(status), s, api.error().c_str());
  EXPECT_NE(status, CAD_STATUS_OK);
  EXPECT_LT(s, g_timeout_ms / 1000.0 + 10.0) << "bounded by the timeout";
  std::fflush(stdout);
  // The job cannot finish collectively any more: leave with a failure status (as a trainer would).
  std::_Exit(status == CAD_STATUS_OK ? 1 : 3);
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  for (int i = 1; i < argc; ++i) g_nccl = g_nccl || std::strcmp(argv[i], "--nccl") == 0;
  for (int i = 1; i < argc; ++i) g_copy_engines = g_copy_engines || std::strcmp(argv[i], "--copy-engines") == 0;
  ::testing::InitGoogleTest(&argc, argv);
  int devices = 1;
  cudaGetDeviceCount(&devices);
  g_device = g_rank % std::max(devices, 1);
  cudaSetDevice(g_device);
  if (const char* fault = std::getenv("CAD_TEST_FAULT")) {
    g_fault = fault;
    g_timeout_ms = 3000;  // the fault tests wait for this
  }
  int rc = 1;
  try {
    const std::string config = stack_config();
    cad_host_options_v1_t options{};
    options.struct_size = sizeof(options);
    options.config_json = config.c_str();
    options.search_path = CAD_TEST_PLUGIN_DIR;
    options.device_allocate = &test_allocate;
    options.device_free = &test_free;
    cad::Host host(options);
    g_host = &host;
    rc = RUN_ALL_TESTS();
    g_host = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] cannot build the CAD stack: %s\n", g_rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
