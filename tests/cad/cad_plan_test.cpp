// cad_plan_test.cpp -- ABI v1.1 plans through the CAD plugin under mpirun (part of test_cad_mpi): one
// plan per micro-batch serving several layers, any number of forwards in flight (each backward gets its
// own forward's saved state), and calls that do not belong to their plan refused on every rank.
#include "cad_mpi_harness.h"

using namespace cad_mpi_test;

namespace {

// Layer l of a fake model: the batch's inputs scaled, so every layer computes something different.
GlobalBatch layer_inputs(const GlobalBatch& base, int layer) {
  GlobalBatch b = base;
  const float s = 1.0f + 0.25f * static_cast<float>(layer);
  for (auto* t : {&b.q, &b.k, &b.v, &b.d_o}) {
    for (float& x : *t) x *= s;
  }
  return b;
}

struct PlanGuard {
  Attention a;
  void* plan = nullptr;
  ~PlanGuard() { a.table->release_plan(a.ctx, plan); }
};

}  // namespace

TEST(CadPlan, OnePlanServesEveryLayerWithForwardsInFlight) {
  constexpr int kLayers = 3;
  uint64_t seed = 300;
  for (const std::string& balancer : balancers()) {
    for (bool keep : {true, false}) {
      for (bool causal : {true, false}) {
        SCOPED_TRACE(balancer + (keep ? " keep" : " resend") + (causal ? " causal" : " non-causal"));
        const GlobalBatch base = cad_test::make_batch(spec_for(++seed));
        const Attention a = cad_instance(balancer, keep);
        std::vector<GlobalBatch> batches;
        std::vector<LocalCall> calls;
        for (int l = 0; l < kLayers; ++l) batches.push_back(layer_inputs(base, l));
        for (int l = 0; l < kLayers; ++l) calls.emplace_back(batches[static_cast<size_t>(l)], causal);
        PlanGuard guard{a};
        ASSERT_EQ(make_plan(a, calls[0], base.hq, base.hkv, base.d, &guard.plan), CAD_STATUS_OK)
            << a.table->last_error(a.ctx);
        // Every layer's forward first (as a trainer's forward pass), then the backwards in reverse order.
        std::vector<void*> saved(kLayers, nullptr);
        for (int l = 0; l < kLayers; ++l) {
          ASSERT_EQ(calls[static_cast<size_t>(l)].forward(a, guard.plan, &saved[static_cast<size_t>(l)], l == 0),
                    CAD_STATUS_OK) << a.table->last_error(a.ctx);
          EXPECT_EQ(saved[static_cast<size_t>(l)] != nullptr, keep) << "a saved handle exactly in keep mode";
        }
        for (int l = kLayers - 1; l >= 0; --l) {
          LocalCall& call = calls[static_cast<size_t>(l)];
          ASSERT_EQ(call.backward(a, guard.plan, saved[static_cast<size_t>(l)], false), CAD_STATUS_OK)
              << a.table->last_error(a.ctx);
          a.table->release_saved(a.ctx, saved[static_cast<size_t>(l)]);
          const Outputs want = local_slice(batches[static_cast<size_t>(l)],
                                           oracle(batches[static_cast<size_t>(l)], causal, call.scale));
          SCOPED_TRACE("layer " + std::to_string(l));
          expect_close(call.o.data, want.o, "o");
          expect_close(call.lse.data, want.lse, "lse");
          expect_close(call.d_q.data, want.d_q, "d_q");
          expect_close(call.d_k.data, want.d_k, "d_k");
          expect_close(call.d_v.data, want.d_v, "d_v");
        }
      }
    }
  }
}

TEST(CadPlan, CallsWithAPlanDoNotReplanOrGatherBytes) {
  const GlobalBatch b = cad_test::make_batch(spec_for(320));
  const Attention a = cad_instance(balancers().back(), false);
  LocalCall call(b, true);
  PlanGuard guard{a};
  ASSERT_EQ(make_plan(a, call, b.hq, b.hkv, b.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  std::vector<char> buffer(1 << 20);
  size_t needed = 0;
  // What the plan will do is reported as soon as it is made, before any call.
  ASSERT_EQ(a.table->get_stats_json(a.ctx, buffer.data(), buffer.size(), &needed), CAD_STATUS_OK);
  const auto planned = nlohmann::json::parse(buffer.data());
  ASSERT_TRUE(planned.contains("plan")) << planned.dump();
  EXPECT_EQ(planned.at("plan").at("servers").size(), static_cast<size_t>(g_world));
  EXPECT_GE(planned.at("plan").at("imbalance").get<double>(), 1.0);
  ASSERT_EQ(call.forward(a, guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  ASSERT_EQ(a.table->get_stats_json(a.ctx, buffer.data(), buffer.size(), &needed), CAD_STATUS_OK);
  const auto stats = nlohmann::json::parse(buffer.data());
  EXPECT_FALSE(stats.at("forward").at("replanned").get<bool>());
  EXPECT_EQ(stats.at("forward").at("plan_ms").get<double>(), 0.0);
  EXPECT_TRUE(stats.at("forward").at("bytes_sent_by_rank").empty()) << "no per-rank byte gather per call";
  EXPECT_EQ(stats.at("forward").at("servers").size(), static_cast<size_t>(g_world));
}

TEST(CadPlan, APlanFromAnotherMicroBatchIsRefusedOnEveryRank) {
  const Attention a = cad_instance(balancers().front(), false);
  const GlobalBatch first = cad_test::make_batch(spec_for(330));
  BatchSpec other = spec_for(331);
  other.tokens_per_rank += 3;  // another micro-batch: other documents, other token counts
  const GlobalBatch second = cad_test::make_batch(other);
  LocalCall f(first, true), s(second, true);
  PlanGuard guard{a};
  ASSERT_EQ(make_plan(a, f, first.hq, first.hkv, first.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  const cad_status_t status = s.forward(a, guard.plan);
  const std::string message = a.table->last_error(a.ctx);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << message;
  EXPECT_NE(message.find("another micro-batch"), std::string::npos) << message;
  EXPECT_NE(message.find("forward on rank"), std::string::npos) << "names the rank: " << message;
  EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << ": " << message;
  for (float x : s.o.data) {
    if (x != 7.0f) {
      ADD_FAILURE() << "rank " << g_rank << " wrote O although the call failed";
      break;
    }
  }
  // The plan still works for its own batch afterwards.
  EXPECT_EQ(f.forward(a, guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
}

TEST(CadPlan, KeepModeForwardWithoutSlotIsReSentInItsBackward) {
  // keep_forward_tensors true lets the servers keep; whether they do is each planned forward's choice (a
  // `saved` slot or none). A backward without saved state re-sends Q/K/V/O/LSE and is exact, in the same
  // instance as forwards that kept theirs.
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch b = cad_test::make_batch(spec_for(340));
  LocalCall kept(b, true), resent(b, true);
  PlanGuard guard{a};
  ASSERT_EQ(make_plan(a, resent, b.hq, b.hkv, b.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  void* saved = nullptr;
  ASSERT_EQ(kept.forward(a, guard.plan, &saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  ASSERT_NE(saved, nullptr);
  ASSERT_EQ(resent.forward(a, guard.plan, nullptr), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  ASSERT_EQ(resent.backward(a, guard.plan, nullptr), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  ASSERT_EQ(kept.backward(a, guard.plan, saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  a.table->release_saved(a.ctx, saved);  // a backward borrows its saved state; the caller releases it
  const Outputs want = local_slice(b, oracle(b, true, resent.scale));
  for (LocalCall* call : {&resent, &kept}) {
    expect_close(call->o.data, want.o, "o");
    expect_close(call->d_q.data, want.d_q, "d_q");
    expect_close(call->d_k.data, want.d_k, "d_k");
    expect_close(call->d_v.data, want.d_v, "d_v");
  }
}

TEST(CadPlan, MakePlanWithInconsistentPiecesFailsOnEveryRank) {
  // Rank 0 claims one token too many of its first document: the tables overlap or leave a gap.
  const GlobalBatch b = cad_test::make_batch(spec_for(350));
  const Attention a = cad_instance(balancers().front(), false);
  LocalCall call(b, true);
  if (g_rank == 0 && !call.pieces.empty()) call.pieces[0].doc_len += 1;
  void* plan = nullptr;
  const cad_status_t status = make_plan(a, call, b.hq, b.hkv, b.d, &plan);
  const std::string message = a.table->last_error(a.ctx);
  const bool rank0_has_pieces = !b.pieces[0].empty();
  if (rank0_has_pieces) {
    EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << message;
    EXPECT_EQ(plan, nullptr);
    EXPECT_NE(message.find("document"), std::string::npos) << message;
    EXPECT_TRUE(same_on_every_rank(message)) << message;
  }
  a.table->release_plan(a.ctx, plan);
}

TEST(CadPlan, MakePlanRefusesBadArgumentsOnEveryRankNamingThem) {
  const GlobalBatch b = cad_test::make_batch(spec_for(360));
  const Attention a = cad_instance(balancers().front(), false);
  LocalCall call(b, true);
  struct Case {
    const char* name;
    std::function<void(cad_attention_plan_args_v1_t&)> edit;  // applied on the last rank only
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"CUDA device on a CPU stack", [](auto& p) { p.device = {CAD_DEVICE_CUDA, 0}; }, "device type"},
      {"Hq not a multiple of Hkv", [](auto& p) { p.num_kv_heads = 3; }, "not a multiple"},
      {"a stream on the CPU path", [](auto& p) { p.stream = reinterpret_cast<void*>(0x1); }, "stream must be NULL"},
      {"args too small", [](auto& p) { p.struct_size = 8; }, "struct_size"},
  };
  for (const Case& c : cases) {
    cad_attention_plan_args_v1_t args{};
    args.struct_size = sizeof(args);
    args.pieces = call.pieces.data();
    args.num_pieces = static_cast<int64_t>(call.pieces.size());
    args.num_q_heads = static_cast<int32_t>(b.hq);
    args.num_kv_heads = static_cast<int32_t>(b.hkv);
    args.head_dim = static_cast<int32_t>(b.d);
    args.dtype = {CAD_DTYPE_CODE_FLOAT, 32, 1};
    args.causal = 1;
    args.device = {CAD_DEVICE_CPU, 0};
    if (g_rank == g_world - 1) c.edit(args);
    void* plan = nullptr;
    const cad_status_t status = a.table->make_plan(a.ctx, &args, &plan);
    const std::string message = a.table->last_error(a.ctx);
    EXPECT_NE(status, CAD_STATUS_OK) << c.name;
    EXPECT_EQ(plan, nullptr) << c.name;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.name << ": " << message;
    EXPECT_NE(message.find("rank " + std::to_string(g_world - 1)), std::string::npos) << c.name << ": " << message;
    EXPECT_TRUE(same_on_every_rank(message)) << c.name << ": rank " << g_rank << ": " << message;
  }
}

// A planned call's tensors are checked against its plan in one place (plugins/cad/call_check.h): a tensor that
// differs on one rank is refused on every rank, once (one message, naming the tensor and the plan), and nothing
// is written. Cases for both directions, pieces omitted (the plan fixed them).
TEST(CadPlan, ATensorThatDiffersFromItsPlanIsRefusedOnceOnEveryRankNamingIt) {
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch b = cad_test::make_batch(spec_for(370));
  struct Case {
    const char* tensor;
    bool backward;
    std::function<void(LocalCall&)> edit;  // on the last rank only
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"k", false, [&](LocalCall& c) { c.k.shape[1] = b.hkv + 1; }, "dim 1 (Hkv)"},
      {"lse", false, [](LocalCall& c) { std::swap(c.lse.shape[0], c.lse.shape[1]); }, "dim 0 (Hq)"},
      {"d_o", true, [](LocalCall& c) { c.d_o.shape[0] += 1; }, "dim 0 (Tq)"},
      {"d_v", true, [&](LocalCall& c) { c.d_v.shape[2] = b.d / 2; }, "dim 2 (D)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    LocalCall call(b, true);
    PlanGuard guard{a};
    ASSERT_EQ(make_plan(a, call, b.hq, b.hkv, b.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    void* saved = nullptr;
    if (c.backward) {
      ASSERT_EQ(call.forward(a, guard.plan, &saved, false), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    }
    if (g_rank == g_world - 1) c.edit(call);
    const cad_status_t status = c.backward ? call.backward(a, guard.plan, saved, false)
                                           : call.forward(a, guard.plan, nullptr, false);
    const std::string message = a.table->last_error(a.ctx);
    EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << message;
    const std::string named = std::string("tensor '") + c.tensor + "'";
    EXPECT_NE(message.find(named + ": " + c.expected), std::string::npos) << message;
    EXPECT_EQ(message.find(named), message.rfind(named)) << "named once: " << message;
    EXPECT_NE(message.find("as plan #"), std::string::npos) << message;
    EXPECT_NE(message.find("rank " + std::to_string(g_world - 1)), std::string::npos) << message;
    EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << ": " << message;
    if (c.backward) {
      EXPECT_EQ(call.d_q.data, filled({call.tokens, b.hq, b.d}, 7.0f).data) << "d_q written on error";
      a.table->release_saved(a.ctx, saved);
    } else {
      EXPECT_EQ(call.o.data, filled({call.tokens, b.hq, b.d}, 7.0f).data) << "o written on error";
    }
  }
}
