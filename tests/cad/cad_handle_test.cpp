// cad_handle_test.cpp -- plan and saved handles carry what they were made for (part of test_cad_mpi). A call
// given a handle that does not fit it -- a saved state of another shape, other documents or another softmax
// scale, a handle of another instance or one released already, ranks passing different forwards' state or
// different scales -- fails with INVALID_ARGUMENT on every rank, naming the handle, instead of reading past
// buffers or returning wrong results; releasing a handle twice is refused, not a crash.
#include "cad_mpi_harness.h"

using namespace cad_mpi_test;

namespace {

struct PlanGuard {
  Attention a;
  void* plan = nullptr;
  ~PlanGuard() { a.table->release_plan(a.ctx, plan); }
};

bool untouched(const std::vector<float>& t) {
  for (float x : t) {
    if (x != 7.0f) return false;
  }
  return true;
}

// The call failed with INVALID_ARGUMENT on every rank, with the same message containing every needle, and
// left `out` as it was.
void expect_refused(const Attention& a, cad_status_t status, const std::vector<std::string>& needles,
                    const std::vector<float>& out) {
  const std::string message = a.table->last_error(a.ctx);
  EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << "rank " << g_rank << ": " << message;
  for (const std::string& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos)
        << "rank " << g_rank << ": no '" << needle << "' in: " << message;
  }
  EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << ": " << message;
  EXPECT_TRUE(untouched(out)) << "rank " << g_rank << ": outputs written although the call failed";
}

GlobalBatch batch(uint64_t seed, int64_t tokens_per_rank) {
  BatchSpec spec = spec_for(seed);
  spec.tokens_per_rank = tokens_per_rank;
  return cad_test::make_batch(spec);
}

}  // namespace

// Found by valgrind: a v1.0-style backward (no plan) given the saved state of a forward of 16 tokens per rank
// while its pieces hold 64 read past the saved buffers and returned OK with infinite gradients.
TEST(CadHandles, SavedStateOfAForwardWithFewerTokensIsRefused) {
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch small = batch(400, 16), large = batch(401, 64);
  LocalCall f(small, true), b(large, true);
  void* saved = nullptr;
  ASSERT_EQ(f.forward(a, nullptr, &saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  expect_refused(a, b.backward(a, nullptr, saved), {"saved handle", "tokens"}, b.d_q.data);
  a.table->release_saved(a.ctx, saved);
}

// The same token count but other documents: OK and wrong by 1.5 before.
TEST(CadHandles, SavedStateOfOtherDocumentsIsRefused) {
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch first = batch(402, 48);
  LocalCall f(first, true), b(first, true);
  for (cad_piece_v1_t& p : b.pieces) p.doc_id += 1000;  // the same tokens on every rank, other documents
  void* saved = nullptr;
  ASSERT_EQ(f.forward(a, nullptr, &saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  expect_refused(a, b.backward(a, nullptr, saved), {"saved handle", "pieces"}, b.d_q.data);
  // Its own backward still takes it.
  EXPECT_EQ(f.backward(a, nullptr, saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  a.table->release_saved(a.ctx, saved);
}

// A backward's softmax_scale must be its forward's: the kept LSE was computed with it.
TEST(CadHandles, SavedStateOfAForwardWithAnotherScaleIsRefused) {
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch g = batch(404, 48);
  LocalCall call(g, true);
  PlanGuard guard{a};
  ASSERT_EQ(make_plan(a, call, g.hq, g.hkv, g.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  void* saved = nullptr;
  ASSERT_EQ(call.forward(a, guard.plan, &saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  const float scale = call.scale;
  call.scale = 2.0f * scale;
  expect_refused(a, call.backward(a, guard.plan, saved), {"saved handle", "softmax_scale"}, call.d_q.data);
  call.scale = scale;
  EXPECT_EQ(call.backward(a, guard.plan, saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  a.table->release_saved(a.ctx, saved);
}

// Two instances alike: each one's first plan was plan #1, so instance B took A's saved state (wrong by 7.5e-2).
TEST(CadHandles, HandlesOfAnotherInstanceAreRefused) {
  const Attention a = cad_instance_named("cad_twin_a"), b = cad_instance_named("cad_twin_b");
  const GlobalBatch g = batch(410, 48);
  LocalCall call(g, true);
  PlanGuard plan_a{a}, plan_b{b};
  ASSERT_EQ(make_plan(a, call, g.hq, g.hkv, g.d, &plan_a.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  ASSERT_EQ(make_plan(b, call, g.hq, g.hkv, g.d, &plan_b.plan), CAD_STATUS_OK) << b.table->last_error(b.ctx);
  void* saved = nullptr;
  ASSERT_EQ(call.forward(a, plan_a.plan, &saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  expect_refused(b, call.backward(b, plan_b.plan, saved, false), {"saved handle", "not live"}, call.d_q.data);
  expect_refused(b, call.backward(b, nullptr, saved), {"saved handle", "not live"}, call.d_q.data);
  expect_refused(b, call.backward(b, plan_a.plan, saved, false), {"plan handle", "not live"}, call.d_q.data);
  // Releasing it on the wrong instance is refused and leaves it to its own.
  b.table->release_saved(b.ctx, saved);
  EXPECT_NE(std::string(b.table->last_error(b.ctx)).find("not live"), std::string::npos) << b.table->last_error(b.ctx);
  EXPECT_EQ(call.backward(a, plan_a.plan, saved, false), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  a.table->release_saved(a.ctx, saved);
}

// Releasing twice aborted the process (double free); a released handle was read after free.
TEST(CadHandles, ReleasedHandlesAreRefusedAndReleasingTwiceIsNotACrash) {
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch g = batch(420, 48);
  LocalCall call(g, true);
  void* plan = nullptr;
  ASSERT_EQ(make_plan(a, call, g.hq, g.hkv, g.d, &plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  void* saved = nullptr;
  ASSERT_EQ(call.forward(a, plan, &saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  ASSERT_EQ(call.backward(a, plan, saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  a.table->release_saved(a.ctx, saved);
  EXPECT_STREQ(a.table->last_error(a.ctx), "") << "a first release is no error";
  a.table->release_saved(a.ctx, saved);
  const std::string twice = a.table->last_error(a.ctx);
  EXPECT_NE(twice.find("release_saved: saved handle"), std::string::npos) << twice;
  EXPECT_NE(twice.find("not live"), std::string::npos) << twice;
  call.d_q = filled({call.tokens, g.hq, g.d}, 7.0f);
  expect_refused(a, call.backward(a, plan, saved), {"saved handle", "not live"}, call.d_q.data);

  a.table->release_plan(a.ctx, plan);
  a.table->release_plan(a.ctx, plan);
  const std::string plan_twice = a.table->last_error(a.ctx);
  EXPECT_NE(plan_twice.find("release_plan: plan handle"), std::string::npos) << plan_twice;
  call.o = filled({call.tokens, g.hq, g.d}, 7.0f);
  expect_refused(a, call.forward(a, plan), {"plan handle", "not live"}, call.o.data);
}

// Under a plan the host-side agreement compared only statuses: a rank with another scale got no error and
// its peers' outputs were wrong by 0.7-1.4.
TEST(CadHandles, RanksThatDisagreeOnSoftmaxScaleUnderAPlanAreRefused) {
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks";
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch g = batch(430, 48);
  LocalCall call(g, true);
  PlanGuard guard{a};
  ASSERT_EQ(make_plan(a, call, g.hq, g.hkv, g.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  const float scale = call.scale;
  if (g_rank == g_world - 1) call.scale = 2.0f * scale;
  void* saved = nullptr;
  expect_refused(a, call.forward(a, guard.plan, &saved), {"softmax_scale", "rank " + std::to_string(g_world - 1)},
                 call.o.data);
  EXPECT_EQ(saved, nullptr);
  call.scale = scale;
  ASSERT_EQ(call.forward(a, guard.plan, &saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  // The backward's scale is the forward's on every rank but one: refused too (that rank's saved state names it).
  if (g_rank == g_world - 1) call.scale = 2.0f * scale;
  expect_refused(a, call.backward(a, guard.plan, saved), {"softmax_scale"}, call.d_q.data);
  a.table->release_saved(a.ctx, saved);
}

// Two layers' forwards in flight, their backwards in another order on rank 0: each backward mixed one
// layer's dO with another layer's kept Q/K/V wherever a document is cut across ranks, silently.
TEST(CadHandles, BackwardsInAnotherOrderOnOneRankAreRefused) {
  if (g_world < 2) GTEST_SKIP() << "needs 2 ranks";
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch g = batch(440, 48);
  for (bool planned : {true, false}) {
    SCOPED_TRACE(planned ? "with a plan" : "without a plan");
    std::vector<LocalCall> layers;
    layers.emplace_back(g, true);
    layers.emplace_back(g, true);
    PlanGuard guard{a};
    if (planned) {
      ASSERT_EQ(make_plan(a, layers[0], g.hq, g.hkv, g.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    }
    void* saved[2] = {nullptr, nullptr};
    for (int l = 0; l < 2; ++l) {
      ASSERT_EQ(layers[static_cast<size_t>(l)].forward(a, guard.plan, &saved[l]), CAD_STATUS_OK)
          << a.table->last_error(a.ctx);
    }
    for (int step = 0; step < 2; ++step) {
      const int l = g_rank == 0 ? step : 1 - step;  // rank 0: layer 0 first; the others: layer 1 first
      LocalCall& call = layers[static_cast<size_t>(l)];
      expect_refused(a, call.backward(a, guard.plan, saved[l]), {"forward", "rank 0", "rank 1"}, call.d_q.data);
    }
    // In the same order on every rank they are fine.
    for (int l = 1; l >= 0; --l) {
      EXPECT_EQ(layers[static_cast<size_t>(l)].backward(a, guard.plan, saved[l]), CAD_STATUS_OK)
          << a.table->last_error(a.ctx);
      a.table->release_saved(a.ctx, saved[l]);
    }
  }
}

// v1.0 calls (no plan, no saved slot) in keep mode: the backward reuses the instance's last forward, whose
// kept LSE holds that forward's scale; another scale returned OK with wrong gradients.
TEST(CadHandles, V10BackwardWithAnotherScaleThanTheLastForwardIsRefused) {
  const Attention a = cad_instance(balancers().front(), true);
  const GlobalBatch g = batch(450, 48);
  LocalCall call(g, true);
  ASSERT_EQ(call.forward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  const float scale = call.scale;
  call.scale = 2.0f * scale;
  expect_refused(a, call.backward(a), {"softmax_scale", "last forward"}, call.d_q.data);
  call.scale = scale;
  EXPECT_EQ(call.backward(a), CAD_STATUS_OK) << a.table->last_error(a.ctx);
}
