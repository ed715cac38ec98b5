// cad_window_test.cpp -- causal sliding windows through CAD under mpirun: every balancer's windowed tasks
// (KV ranges [max(0, q_begin - left), q_end), one copy per server and document) against the reference math
// over whole documents; plans carry the window, and a call with another window is refused; windows CAD
// cannot compute (non-causal) are refused on every rank alike.
//
// Collective discipline as in cad_mpi_test.cpp: every rank makes the same calls in the same order.
#include <cstdint>

#include "cad_mpi_harness.h"

using namespace cad_mpi_test;

namespace {

struct PlanGuard {
  Attention a;
  void* plan = nullptr;
  ~PlanGuard() { a.table->release_plan(a.ctx, plan); }
};

}  // namespace

// Windows from 0 (each query sees itself) past every document (80 tokens per rank at most), up to the int64
// limit (no window in effect: the cost model, the layout and the server's key ranges must not wrap).
TEST(CadWindow, MatchesReferenceForEveryBalancerAndKeepMode) {
  uint64_t seed = 700;
  for (const std::string& balancer : balancers()) {
    for (bool keep : {true, false}) {
      for (int64_t left : {int64_t{0}, int64_t{3}, int64_t{17}, int64_t{100000}, INT64_MAX - 1, INT64_MAX}) {
        SCOPED_TRACE(balancer + (keep ? " keep" : " resend") + " window_left=" + std::to_string(left));
        expect_step_matches(cad_instance(balancer, keep), cad_test::make_batch(spec_for(++seed)), true, left);
      }
    }
  }
}

TEST(CadWindow, APlanCarriesItsWindow) {
  const GlobalBatch b = cad_test::make_batch(spec_for(720));
  for (bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "keep" : "resend");
    const Attention a = cad_instance(balancers().back(), keep);
    LocalCall call(b, true);
    call.window_left = 5;
    const Outputs want = local_slice(b, oracle(b, true, call.scale, 5));
    PlanGuard guard{a};
    ASSERT_EQ(make_plan(a, call, b.hq, b.hkv, b.d, &guard.plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    void* saved = nullptr;
    ASSERT_EQ(call.forward(a, guard.plan, &saved, false), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    ASSERT_EQ(call.backward(a, guard.plan, saved, false), CAD_STATUS_OK) << a.table->last_error(a.ctx);
    a.table->release_saved(a.ctx, saved);
    expect_close(call.o.data, want.o, "o");
    expect_close(call.lse.data, want.lse, "lse");
    expect_close(call.d_q.data, want.d_q, "d_q");
    expect_close(call.d_k.data, want.d_k, "d_k");
    expect_close(call.d_v.data, want.d_v, "d_v");

    // The same plan for a global layer (no window), or another window: refused, naming the window.
    for (int64_t other : {int64_t{-1}, int64_t{6}}) {
      LocalCall global(b, true);
      global.window_left = other;
      const cad_status_t status = global.forward(a, guard.plan, nullptr, false);
      const std::string message = a.table->last_error(a.ctx);
      EXPECT_EQ(status, CAD_STATUS_INVALID_ARGUMENT) << message;
      EXPECT_NE(message.find("window_left"), std::string::npos) << message;
      EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << ": " << message;
      EXPECT_EQ(global.o.data, filled({global.tokens, b.hq, b.d}, 7.0f).data) << "outputs touched on error";
    }
  }
}

TEST(CadWindow, NonCausalAndBadWindowsAreRefusedOnEveryRank) {
  const GlobalBatch b = cad_test::make_batch(spec_for(730));
  const Attention a = cad_instance(balancers().front(), true);
  struct Bad {
    bool causal;
    int64_t left;
    cad_status_t status;
    const char* names;
  };
  for (const Bad& bad : {Bad{false, 4, CAD_STATUS_UNSUPPORTED, "causal attention only"},
                         Bad{true, -2, CAD_STATUS_INVALID_ARGUMENT, "window_left"}}) {
    LocalCall call(b, bad.causal);
    call.window_left = bad.left;
    const cad_status_t status = call.forward(a);
    const std::string message = a.table->last_error(a.ctx);
    EXPECT_EQ(status, bad.status) << message;
    EXPECT_NE(message.find(bad.names), std::string::npos) << message;
    EXPECT_TRUE(same_on_every_rank(message)) << "rank " << g_rank << ": " << message;
    void* plan = nullptr;
    EXPECT_EQ(make_plan(a, call, b.hq, b.hkv, b.d, &plan), bad.status);
    EXPECT_EQ(plan, nullptr);
  }
}
