// cad_mpi_harness.h -- what the multi-rank CAD tests share (cad_mpi_test.cpp, cad_plan_test.cpp): the
// rank, the host stack, a global batch's local call on this rank, the oracle, comparisons.
#pragma once

#include <mpi.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <cstring>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cad/cad_host.hpp"
#include "reference_math.h"
#include "test_batch.h"

namespace cad_mpi_test {

using cad_test::BatchSpec;
using cad_test::GlobalBatch;

inline int g_rank = 0;
inline int g_world = 1;
inline cad::Host* g_host = nullptr;

inline std::vector<std::string> balancers() {
  std::vector<std::string> names;
  std::stringstream list(CAD_TEST_BALANCERS);
  for (std::string name; std::getline(list, name, ',');) {
    if (!name.empty()) names.push_back(name);
  }
  return names;
}

inline std::string instance_name(const std::string& balancer, bool keep) {
  return "cad_" + balancer + (keep ? "_keep" : "_resend");
}

inline std::string stack_config() {
  nlohmann::json instances = nlohmann::json::array();
  instances.push_back({{"name", "comm"}, {"plugin", "mpi"}, {"config", {{"timeout_ms", 60000}}}});
  instances.push_back({{"name", "server"}, {"plugin", "reference"}, {"config", {{"num_threads", 1}}}});
  // A CAD instance over `balancer` (a plugin name) with the keys every one here has, plus `extra`.
  const auto add_cad = [&](const std::string& name, const std::string& balancer, const nlohmann::json& extra) {
    nlohmann::json config = {{"communicator", "comm"}, {"balancer", "bal_" + balancer}, {"server_backend", "server"}};
    config.update(extra);
    instances.push_back({{"name", name}, {"plugin", "cad"}, {"config", config}});
  };
  for (const std::string& b : balancers()) {
    instances.push_back({{"name", "bal_" + b}, {"plugin", b}, {"config", nlohmann::json::object()}});
    for (bool keep : {true, false}) {
      // own_tasks_in_place is off by default: these cover it on every balancer.
      add_cad(instance_name(b, keep), b,
              {{"keep_forward_tensors", keep}, {"own_tasks_in_place", true}, {"min_shard_tokens", 8}});
    }
  }
  // Two instances alike (keep mode), for handles taken to the wrong instance (cad_handle_test.cpp).
  for (const char* twin : {"cad_twin_a", "cad_twin_b"}) add_cad(twin, balancers().front(), {{"min_shard_tokens", 8}});
  // The tasks run in place go to a server backend instance of their own (own_server_backend).
  instances.push_back({{"name", "server_own"}, {"plugin", "reference"}, {"config", {{"num_threads", 1}}}});
  add_cad("cad_own_backend", balancers().front(),
          {{"own_tasks_in_place", true}, {"own_server_backend", "server_own"}, {"min_shard_tokens", 8}});
  // The first balancer with every task sent through the exchange, also the tasks a server could run in place on
  // its own tensors (own_tasks_in_place false, the default): the path the in-place one must agree with.
  add_cad("cad_exchange_own", balancers().front(), {{"own_tasks_in_place", false}, {"min_shard_tokens", 8}});
  // A server may receive at most 1 byte: any plan that moves data is refused by the balancer.
  add_cad("cad_capped", balancers().back(), {{"memory_cap_bytes", 1}});
  // The last rank configures another head_groups than the others (each rank builds its own config).
  add_cad("cad_head_groups_differ", balancers().front(), {{"head_groups", g_rank == g_world - 1 ? 2 : 1}});
  return nlohmann::json{{"log_level", "warn"}, {"instances", instances}}.dump();
}

struct Attention {
  const cad_attention_v1_t* table;
  void* ctx;
};

inline Attention cad_instance_named(const std::string& name) {
  const auto found = g_host->find<cad_attention_v1_t>(name, CAD_PLUGIN_KIND_ATTENTION);
  return Attention{found.first, found.second};
}

inline Attention cad_instance(const std::string& balancer, bool keep) {
  return cad_instance_named(instance_name(balancer, keep));
}

// A CPU fp32 tensor that owns its data and shape; desc() is valid while the Tensor lives.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  cad_tensor_v1_t view{};

  Tensor(std::vector<int64_t> dims, std::vector<float> values) : shape(std::move(dims)), data(std::move(values)) {}
  cad_tensor_v1_t* desc() {
    view.data = data.data();
    view.device = {CAD_DEVICE_CPU, 0};
    view.ndim = static_cast<int32_t>(shape.size());
    view.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
    view.shape = shape.data();
    view.strides = nullptr;
    view.byte_offset = 0;
    return &view;
  }
};

inline Tensor filled(std::vector<int64_t> dims, float value) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return Tensor(std::move(dims), std::vector<float>(static_cast<size_t>(n), value));
}

struct Outputs {
  std::vector<float> o, lse, d_q, d_k, d_v;
};

// The oracle: the reference math over the global batch, one segment per document. Only the documents
// this rank holds a piece of matter to it, so it skips the others (the rows stay 0 and are not read).
inline Outputs oracle(const GlobalBatch& b, bool causal, float scale, int64_t window_left = -1) {
  std::set<int64_t> mine;
  for (const auto& p : b.pieces[static_cast<size_t>(g_rank)]) mine.insert(p.doc_id);
  std::vector<cad_segment_v1_t> segments;
  for (const auto& doc : b.docs) {
    if (mine.count(doc.id) != 0) segments.push_back({doc.first_row, doc.len, doc.first_row, doc.len});
  }
  cad::reference::AttentionBatch batch;
  batch.tq = batch.tk = b.total_tokens;
  batch.hq = b.hq;
  batch.hkv = b.hkv;
  batch.d = b.d;
  batch.segments = segments.data();
  batch.num_segments = static_cast<int64_t>(segments.size());
  batch.softmax_scale = scale;
  batch.causal = causal;
  batch.window_left = window_left;  // per document: one segment each, so document positions
  Outputs out;
  out.o.resize(b.q.size());
  out.lse.resize(static_cast<size_t>(b.hq * b.total_tokens));
  out.d_q.resize(b.q.size());
  out.d_k.resize(b.k.size());
  out.d_v.resize(b.v.size());
  cad::reference::attention_forward(batch, b.q.data(), b.k.data(), b.v.data(), out.o.data(), out.lse.data(), 1);
  cad::reference::attention_backward(batch, b.q.data(), b.k.data(), b.v.data(), out.o.data(), out.lse.data(),
                                     b.d_o.data(), out.d_q.data(), out.d_k.data(), out.d_v.data(), 1);
  return out;
}

// This rank's slice of the oracle.
inline Outputs local_slice(const GlobalBatch& b, const Outputs& global) {
  const std::vector<int64_t> rows = b.global_rows(g_rank);
  Outputs out;
  out.o = cad_test::take_rows(global.o, b.hq * b.d, rows);
  out.lse = cad_test::take_columns(global.lse, b.hq, b.total_tokens, rows);
  out.d_q = cad_test::take_rows(global.d_q, b.hq * b.d, rows);
  out.d_k = cad_test::take_rows(global.d_k, b.hkv * b.d, rows);
  out.d_v = cad_test::take_rows(global.d_v, b.hkv * b.d, rows);
  return out;
}

// The host's side of one step on this rank: its pieces and tensors.
struct LocalCall {
  std::vector<cad_piece_v1_t> pieces;
  int64_t tokens = 0;
  Tensor q, k, v, d_o, o, lse, d_q, d_k, d_v;
  bool causal = true;
  float scale = 0.25f;
  int64_t window_left = -1;  // sliding window of every call and plan (-1 = none)

  LocalCall(const GlobalBatch& b, bool is_causal, int64_t extra_q_rows = 0, int64_t head_dim = -1)
      : pieces(b.pieces[static_cast<size_t>(g_rank)]),
        q({}, {}), k({}, {}), v({}, {}), d_o({}, {}), o({}, {}), lse({}, {}), d_q({}, {}), d_k({}, {}), d_v({}, {}) {
    const std::vector<int64_t> rows = b.global_rows(g_rank);
    tokens = static_cast<int64_t>(rows.size());
    const int64_t d = head_dim > 0 ? head_dim : b.d;
    if (head_dim > 0) {  // a rank that disagrees on the head dim: shapes only, values do not matter
      q = filled({tokens, b.hq, d}, 0.5f);
      k = filled({tokens, b.hkv, d}, 0.5f);
      v = filled({tokens, b.hkv, d}, 0.5f);
      d_o = filled({tokens, b.hq, d}, 0.5f);
    } else {
      q = Tensor({tokens + extra_q_rows, b.hq, d}, cad_test::take_rows(b.q, b.hq * d, rows));
      q.data.resize(static_cast<size_t>((tokens + extra_q_rows) * b.hq * d), 0.0f);
      k = Tensor({tokens, b.hkv, d}, cad_test::take_rows(b.k, b.hkv * d, rows));
      v = Tensor({tokens, b.hkv, d}, cad_test::take_rows(b.v, b.hkv * d, rows));
      d_o = Tensor({tokens, b.hq, d}, cad_test::take_rows(b.d_o, b.hq * d, rows));
    }
    // Outputs start as a sentinel, to see what is written (and that nothing is on error).
    o = filled({tokens, b.hq, d}, 7.0f);
    lse = filled({b.hq, tokens}, 7.0f);
    d_q = filled({tokens, b.hq, d}, 7.0f);
    d_k = filled({tokens, b.hkv, d}, 7.0f);
    d_v = filled({tokens, b.hkv, d}, 7.0f);
    causal = is_causal;
    scale = 1.0f / std::sqrt(static_cast<float>(d));
  }

  // With a plan (ABI v1.1) the pieces are left out unless `with_pieces`; `saved` receives the forward's
  // saved state.
  cad_status_t forward(const Attention& a, void* plan = nullptr, void** saved = nullptr, bool with_pieces = true) {
    cad_attention_forward_args_v1_t args{};
    args.struct_size = sizeof(args);
    args.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit unless the test sets a window
    args.window_left = window_left;
    args.window_right = -1;
    args.pieces = pieces.data();
    args.num_pieces = static_cast<int64_t>(pieces.size());
    args.softmax_scale = scale;
    args.causal = causal ? 1 : 0;
    args.q = q.desc();
    args.k = k.desc();
    args.v = v.desc();
    args.o = o.desc();
    args.lse = lse.desc();
    args.plan = plan;
    args.saved = saved;
    if (!with_pieces) {
      args.pieces = nullptr;
      args.num_pieces = 0;
    }
    return a.table->forward(a.ctx, &args);
  }

  cad_status_t backward(const Attention& a, void* plan = nullptr, void* saved = nullptr, bool with_pieces = true) {
    cad_attention_backward_args_v1_t args{};
    args.struct_size = sizeof(args);
    args.window_flags = CAD_WINDOW_GIVEN;
    args.window_left = window_left;
    args.window_right = -1;
    args.pieces = pieces.data();
    args.num_pieces = static_cast<int64_t>(pieces.size());
    args.softmax_scale = scale;
    args.causal = causal ? 1 : 0;
    args.q = q.desc();
    args.k = k.desc();
    args.v = v.desc();
    args.o = o.desc();
    args.lse = lse.desc();
    args.d_o = d_o.desc();
    args.d_q = d_q.desc();
    args.d_k = d_k.desc();
    args.d_v = d_v.desc();
    args.plan = plan;
    args.saved = saved;
    if (!with_pieces) {
      args.pieces = nullptr;
      args.num_pieces = 0;
    }
    return a.table->backward(a.ctx, &args);
  }
};

// make_plan for this rank's pieces of `call` (fp32, CPU); collective.
inline cad_status_t make_plan(const Attention& a, const LocalCall& call, int64_t hq, int64_t hkv, int64_t d,
                              void** plan) {
  cad_attention_plan_args_v1_t args{};
  args.struct_size = sizeof(args);
  args.window_flags = CAD_WINDOW_GIVEN;
  args.window_left = call.window_left;  // the plan is made for the call's window
  args.window_right = -1;
  args.pieces = call.pieces.data();
  args.num_pieces = static_cast<int64_t>(call.pieces.size());
  args.num_q_heads = static_cast<int32_t>(hq);
  args.num_kv_heads = static_cast<int32_t>(hkv);
  args.head_dim = static_cast<int32_t>(d);
  args.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
  args.causal = call.causal ? 1 : 0;
  args.device = {CAD_DEVICE_CPU, 0};
  return a.table->make_plan(a.ctx, &args, plan);
}

inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* name, double tol = 1e-5) {
  const double err = cad_test::relative_error(got, want);
  EXPECT_LE(err, tol) << "rank " << g_rank << ": tensor " << name << " max relative error " << err;
}

// True when every rank passed the same string.
inline bool same_on_every_rank(const std::string& text) {
  std::vector<char> mine(1024, '\0'), all(1024 * static_cast<size_t>(g_world));
  std::strncpy(mine.data(), text.c_str(), mine.size() - 1);
  MPI_Allgather(mine.data(), 1024, MPI_CHAR, all.data(), 1024, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < g_world; ++r) {
    if (std::strncmp(all.data() + 1024 * r, mine.data(), 1024) != 0) return false;
  }
  return true;
}

inline BatchSpec spec_for(uint64_t seed) {
  BatchSpec spec;
  spec.seed = seed;
  spec.world = g_world;
  spec.tokens_per_rank = g_world >= 8 ? 48 : 80;  // up to 8 ranks share 2 cores in CI: keep it small
  return spec;
}

// One full step through `a`; expects it to match the oracle.
inline void expect_step_matches(const Attention& a, const GlobalBatch& b, bool causal, int64_t window_left = -1) {
  LocalCall call(b, causal);
  call.window_left = window_left;
  const Outputs want = local_slice(b, oracle(b, causal, call.scale, window_left));
  const cad_status_t fs = call.forward(a);
  ASSERT_EQ(fs, CAD_STATUS_OK) << a.table->last_error(a.ctx);  // agreed on every rank: no desync
  const cad_status_t bs = call.backward(a);
  ASSERT_EQ(bs, CAD_STATUS_OK) << a.table->last_error(a.ctx);
  expect_close(call.o.data, want.o, "o");
  expect_close(call.lse.data, want.lse, "lse");
  expect_close(call.d_q.data, want.d_q, "d_q");
  expect_close(call.d_k.data, want.d_k, "d_k");
  expect_close(call.d_v.data, want.d_v, "d_v");
}

// Ranks other than 0 print only their failures, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", g_rank, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
    }
  }
};

// The main of a multi-rank test program: MPI (the test owns it, so the mpi plugin neither initialises nor
// finalises it), gtest with only rank 0's full report, the host stack `config()` describes (built after MPI, so
// it may depend on the rank), and the worst result over every rank, so that one rank's failure fails the job.
// `thread_multiple`: refuse to run without MPI_THREAD_MULTIPLE (a stack whose plugins call MPI from two threads).
inline int run_mpi_tests(int argc, char** argv, const std::function<std::string()>& config, const char* stack,
                         bool thread_multiple = false) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  ::testing::InitGoogleTest(&argc, argv);
  if (g_rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter);
  }
  if (thread_multiple && provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "[rank %d] MPI gives no MPI_THREAD_MULTIPLE, which the %s needs\n", g_rank, stack);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rc = 1;
  try {
    const std::string json = config();
    cad_host_options_v1_t options{};
    options.struct_size = sizeof(options);
    options.config_json = json.c_str();
    options.search_path = CAD_TEST_PLUGIN_DIR;
    cad::Host host(options);
    g_host = &host;
    rc = RUN_ALL_TESTS();
    g_host = nullptr;
  } catch (const cad::Error& e) {
    std::fprintf(stderr, "[rank %d] cannot build the %s: %s\n", g_rank, stack, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}

}  // namespace cad_mpi_test
