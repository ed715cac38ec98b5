// cad_overlap_test.cpp -- overlap_local under mpirun (part of test_cad_mpi): every server computes its local
// part (the documents whose rows are all its own: layout.h BatchPart::local) before the exchange of the other
// owners' rows, its own rows copied without communication, then the rest. The CPU path runs exactly that order
// (nothing overlaps on the host, but a local part that needed an exchanged row would read zeros there), so:
//  - the outputs are the same bits as without overlap_local: the reference computes each segment on its own and
//    the split never cuts a shared K/V copy (dK/dV sums) -- a task dropped or computed twice changes them;
//  - and they match the oracle;
// for every balancer, both masks, windows, keep and re-send, one-shot and planned calls, ranks that hold nothing.
//
// Collective discipline as in cad_mpi_test.cpp: every rank makes the same calls in the same order.
#include "cad_mpi_harness.h"

using namespace cad_mpi_test;

namespace {

// One forward and backward of `b` through `a`: this rank's O, LSE, dQ, dK, dV.
Outputs run_step(const Attention& a, const GlobalBatch& b, bool causal, bool planned, int64_t window_left = -1) {
  LocalCall call(b, causal);
  call.window_left = window_left;
  void* plan = nullptr;
  void* saved = nullptr;
  if (planned) {
    EXPECT_EQ(make_plan(a, call, b.hq, b.hkv, b.d, &plan), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  }
  EXPECT_EQ(call.forward(a, plan, planned ? &saved : nullptr), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  EXPECT_EQ(call.backward(a, plan, saved), CAD_STATUS_OK) << a.table->last_error(a.ctx);
  a.table->release_saved(a.ctx, saved);
  a.table->release_plan(a.ctx, plan);
  return Outputs{call.o.data, call.lse.data, call.d_q.data, call.d_k.data, call.d_v.data};
}

void expect_same_bits(const Outputs& got, const Outputs& want) {
  EXPECT_EQ(got.o, want.o) << "rank " << g_rank << ": O";
  EXPECT_EQ(got.lse, want.lse) << "rank " << g_rank << ": LSE";
  EXPECT_EQ(got.d_q, want.d_q) << "rank " << g_rank << ": dQ";
  EXPECT_EQ(got.d_k, want.d_k) << "rank " << g_rank << ": dK";
  EXPECT_EQ(got.d_v, want.d_v) << "rank " << g_rank << ": dV";
}

void expect_matches(const Outputs& got, const Outputs& want) {
  expect_close(got.o, want.o, "o");
  expect_close(got.lse, want.lse, "lse");
  expect_close(got.d_q, want.d_q, "d_q");
  expect_close(got.d_k, want.d_k, "d_k");
  expect_close(got.d_v, want.d_v, "d_v");
}

nlohmann::json stats_of(const Attention& a) {
  size_t needed = 0;
  a.table->get_stats_json(a.ctx, nullptr, 0, &needed);
  std::string buffer(needed, '\0');
  EXPECT_EQ(a.table->get_stats_json(a.ctx, buffer.data(), buffer.size(), &needed), CAD_STATUS_OK);
  return nlohmann::json::parse(buffer.c_str());
}

int64_t sum_over_ranks(int64_t mine) {
  int64_t total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

}  // namespace

TEST(CadOverlap, SameBitsAsWithoutOverlapForEveryBalancerMaskKeepModeAndPlan) {
  uint64_t seed = 1100;
  for (const std::string& balancer : balancers()) {
    for (bool causal : {true, false}) {
      for (bool keep : {true, false}) {
        for (bool planned : {false, true}) {
          SCOPED_TRACE(balancer + (causal ? " causal" : " non-causal") + (keep ? " keep" : " resend") +
                       (planned ? " planned" : " one-shot"));
          const GlobalBatch b = cad_test::make_batch(spec_for(++seed));
          const Outputs serial = run_step(cad_instance(balancer, keep, false), b, causal, planned);
          const Outputs overlapped = run_step(cad_instance(balancer, keep, true), b, causal, planned);
          expect_same_bits(overlapped, serial);
          LocalCall probe(b, causal);
          expect_matches(overlapped, local_slice(b, oracle(b, causal, probe.scale)));
        }
      }
    }
  }
}

TEST(CadOverlap, SameBitsWithWindowsAndWiderHeads) {
  uint64_t seed = 1200;
  for (const std::string& balancer : balancers()) {
    for (int64_t left : {0, 3, 17}) {
      SCOPED_TRACE(balancer + " window_left=" + std::to_string(left));
      const GlobalBatch b = cad_test::make_batch(spec_for(++seed));
      const Outputs serial = run_step(cad_instance(balancer, true, false), b, true, true, left);
      const Outputs overlapped = run_step(cad_instance(balancer, true, true), b, true, true, left);
      expect_same_bits(overlapped, serial);
      LocalCall probe(b, true);
      expect_matches(overlapped, local_slice(b, oracle(b, true, probe.scale, left)));
    }
  }
  BatchSpec spec = spec_for(1250);  // multi-head (Hq = Hkv), wider heads
  spec.hq = spec.hkv = 3;
  spec.d = 32;
  const GlobalBatch b = cad_test::make_batch(spec);
  expect_same_bits(run_step(cad_instance(balancers().back(), false, true), b, true, false),
                   run_step(cad_instance(balancers().back(), false, false), b, true, false));
}

TEST(CadOverlap, EveryDocumentOnOneRank) {
  // All documents on the last rank: its batch is local under colocated; the others serve work they receive.
  GlobalBatch b = cad_test::make_batch(spec_for(1300));
  for (int r = 0; r + 1 < g_world; ++r) {
    auto& last = b.pieces[static_cast<size_t>(g_world - 1)];
    last.insert(last.end(), b.pieces[static_cast<size_t>(r)].begin(), b.pieces[static_cast<size_t>(r)].end());
    b.pieces[static_cast<size_t>(r)].clear();
  }
  for (const std::string& balancer : balancers()) {
    SCOPED_TRACE(balancer);
    expect_same_bits(run_step(cad_instance(balancer, false, true), b, true, false),
                     run_step(cad_instance(balancer, false, false), b, true, false));
  }
}

TEST(CadOverlap, ARankLocalChoice) {
  // overlap_local on even ranks only: the layout does not depend on it, so the ranks still agree on every byte.
  const GlobalBatch b = cad_test::make_batch(spec_for(1400));
  for (bool planned : {false, true}) {
    expect_same_bits(run_step(cad_instance_named("cad_overlap_even_ranks"), b, true, planned),
                     run_step(cad_instance(balancers().back(), true, false), b, true, planned));
  }
}

TEST(CadOverlap, TheLocalPartOnABackendOfItsOwn) {
  // overlap_server_backend: the local parts' calls (and plans) go to that instance, the rest to server_backend.
  const GlobalBatch b = cad_test::make_batch(spec_for(1450));
  const Attention own = cad_instance_named("cad_overlap_own_backend");
  bool any_first = false;  // this rank had a local part in some call (causal calls have more: shorter K/V)
  for (bool planned : {false, true}) {
    for (bool causal : {true, false}) {
      expect_same_bits(run_step(own, b, causal, planned),
                       run_step(cad_instance(balancers().front(), true, false), b, causal, planned));
      any_first = any_first || stats_of(own).at("backward").at("local_part").at("computed_first").get<bool>();
    }
  }
  // The reference backend reports its last forward's time (0 before any): the early instance ran exactly where
  // there was a local part.
  const nlohmann::json early = stats_of(cad_instance_named("server_early"));
  EXPECT_EQ(early.at("forward_ms").get<double>() > 0.0, any_first) << "rank " << g_rank << ": " << early.dump();
}

TEST(CadOverlap, StatsCountTheLocalPart) {
  for (const std::string& balancer : balancers()) {
    SCOPED_TRACE(balancer);
    const GlobalBatch b = cad_test::make_batch(spec_for(1500));
    const Attention on = cad_instance(balancer, true, true), off = cad_instance(balancer, true, false);
    LocalCall call_on(b, true), call_off(b, true);
    ASSERT_EQ(call_on.forward(on), CAD_STATUS_OK) << on.table->last_error(on.ctx);
    ASSERT_EQ(call_off.forward(off), CAD_STATUS_OK) << off.table->last_error(off.ctx);
    const nlohmann::json fwd_on = stats_of(on).at("forward"), fwd_off = stats_of(off).at("forward");
    const nlohmann::json &local = fwd_on.at("local_part"), &local_off = fwd_off.at("local_part");
    const int64_t q_rows = local.at("q_rows").get<int64_t>();
    const int64_t server_q_rows = fwd_on.at("servers").at(static_cast<size_t>(g_rank)).at("q_rows").get<int64_t>();
    EXPECT_EQ(local.at("computed_first").get<bool>(), q_rows > 0) << "computed first exactly where there is a part";
    EXPECT_FALSE(local_off.at("computed_first").get<bool>()) << "not without overlap_local";
    for (const char* key : {"tasks", "segments", "q_rows", "kv_rows", "score_entries"}) {
      EXPECT_EQ(local.at(key), local_off.at(key)) << key << ": the plan's local part, whatever the config";
    }
    EXPECT_LE(q_rows, server_q_rows);
    EXPECT_EQ(q_rows > 0, local.at("tasks").get<int64_t>() > 0);
    const double share = local.at("share_of_server_work").get<double>();
    EXPECT_GE(share, 0.0);
    EXPECT_LE(share, 1.0);
    // The bytes moved: the same as without overlap (own rows never counted), and the cost model's.
    EXPECT_EQ(fwd_on.at("bytes_sent_by_rank").dump(), fwd_off.at("bytes_sent_by_rank").dump());
    EXPECT_EQ(fwd_on.at("bytes_sent_by_rank").dump(), fwd_on.at("model_forward_bytes_sent_by_rank").dump());
    const int64_t local_rows = sum_over_ranks(q_rows);
    EXPECT_LE(local_rows, b.total_tokens);
    if (balancer == "colocated" || g_world == 1) {
      // Every document held by one rank alone is computed where it lies: a local part somewhere.
      EXPECT_GT(local_rows, 0);
    }
  }
}
