// fuzz_plan.cpp -- the piece-table and plan validators: CAD's (plugins/cad/validate.cpp: piece tables of
// all ranks, a balancer's plan) and the balancers' input check (plugins/common/balancer_support.cpp,
// which also asks plan_limits whether the int64 cost model can represent the batch). What they accept
// is re-checked here in 128-bit arithmetic: each document's pieces tile [0, doc_len) exactly once with
// one doc_len, and an accepted plan partitions every document's queries on servers [0, world). The cost
// params carry a sliding window read last (fields at the int64 limits, struct sizes cut inside the window):
// a struct too short for the window it flags must be refused with ABI_MISMATCH, and the windowed cost
// sums must not overflow (UBSan) nor disagree with the unwindowed ones when the window hides no key.
#include <algorithm>
#include <cstddef>
#include <map>
#include <vector>

#include "balancer_support.h"
#include "fuzz_input.h"
#include "validate.h"

namespace {

using cad::fuzz::broken;
using Wide = __int128;
using Tables = std::vector<std::vector<cad_piece_v1_t>>;

// The pieces of every document tile [0, doc_len) exactly once, all saying the same doc_len.
void expect_tiling(const Tables& tables) {
  std::map<int64_t, std::vector<std::pair<Wide, Wide>>> spans;
  std::map<int64_t, int64_t> lengths;
  for (const auto& rank : tables) {
    for (const auto& p : rank) {
      if (p.len < 1) broken("a piece of length < 1 accepted");
      auto [it, fresh] = lengths.emplace(p.doc_id, p.doc_len);
      if (!fresh && it->second != p.doc_len) broken("pieces disagreeing on doc_len accepted");
      spans[p.doc_id].emplace_back(p.offset_in_doc, Wide{p.offset_in_doc} + p.len);
    }
  }
  for (auto& [doc, s] : spans) {
    std::sort(s.begin(), s.end());
    Wide covered = 0;
    for (const auto& [b, e] : s) {
      if (b != covered) broken("pieces with a gap or an overlap accepted");
      covered = e;
    }
    if (covered != lengths[doc]) broken("pieces not covering their document accepted");
  }
}

void expect_partition(const Tables& tables, const std::vector<cad_task_v1_t>& tasks, int32_t world) {
  std::map<int64_t, int64_t> lengths;
  for (const auto& rank : tables)
    for (const auto& p : rank) lengths[p.doc_id] = p.doc_len;
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> ranges;
  for (const auto& t : tasks) {
    if (t.server < 0 || t.server >= world) broken("a task on a server outside [0, world) accepted");
    if (lengths.count(t.doc_id) == 0) broken("a task of an unknown document accepted");
    if (t.q_begin < t.q_end) ranges[t.doc_id].emplace_back(t.q_begin, t.q_end);
  }
  for (const auto& [doc, len] : lengths) {
    auto r = ranges[doc];
    std::sort(r.begin(), r.end());
    int64_t covered = 0;
    for (const auto& [b, e] : r) {
      if (b != covered) broken("a plan with a gap or an overlap accepted");
      covered = e;
    }
    if (covered != len) broken("a plan not covering a document accepted");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cad::fuzz::Input in(data, size);
  const int32_t world = 1 + in.take<uint8_t>() % 4;
  Tables tables(static_cast<size_t>(world));
  const int pieces = in.take<uint8_t>() % 12;
  for (int i = 0; i < pieces; ++i) {
    const size_t rank = in.take<uint8_t>() % static_cast<size_t>(world);
    const int64_t doc = in.take<uint8_t>() % 4;
    tables[rank].push_back({doc, in.number(), in.number(), in.number()});
  }
  std::vector<cad_task_v1_t> tasks;
  const int num_tasks = in.take<uint8_t>() % 12;
  for (int i = 0; i < num_tasks; ++i) {
    const int64_t doc = in.take<uint8_t>() % 4;
    const int64_t begin = in.number(), end = in.number();
    tasks.push_back({doc, begin, end, static_cast<int32_t>(in.take<int8_t>() % 6), 0});
  }

  bool tables_ok = true;
  try {
    cad::cad_plugin::check_piece_tables(tables);
  } catch (const cad::plugin::Failure& f) {
    if (f.status() != CAD_STATUS_INVALID_ARGUMENT) broken("piece tables refused with a status other than INVALID_ARGUMENT");
    tables_ok = false;
  }
  if (tables_ok) {
    expect_tiling(tables);
    try {
      cad::cad_plugin::check_plan(tables, tasks, world, "fuzz");
      expect_partition(tables, tasks, world);
    } catch (const cad::plugin::Failure& f) {
      if (f.status() != CAD_STATUS_INTERNAL) broken("a bad plan refused with a status other than INTERNAL");
    }
  }

  // The balancers' own check of the same pieces: accepted exactly when CAD's check accepts, unless the
  // batch does not fit the cost model (UNSUPPORTED).
  std::vector<cad_rank_pieces_v1_t> views;
  for (const auto& r : tables) views.push_back({r.data(), static_cast<int64_t>(r.size())});
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof cost;
  cost.num_q_heads = 32;
  cost.num_kv_heads = 8;
  cost.head_dim = 128;
  cost.bytes_per_element = 2;
  cost.causal = 1;
  // The window, after everything else (older seeds leave it zero: no window).
  cost.window_flags = in.take<uint8_t>() & 1 ? static_cast<uint32_t>(CAD_WINDOW_GIVEN) : 0u;
  cost.causal = in.take<uint8_t>() & 1 ? 0 : 1;
  cost.window_left = in.window_limit();
  cost.window_right = in.window_limit();
  const size_t sizes[] = {sizeof cost, CAD_COST_PARAMS_V1_1_SIZE, offsetof(cad_cost_params_v1_t, window_flags) + 4,
                          offsetof(cad_cost_params_v1_t, window_left), offsetof(cad_cost_params_v1_t, window_right)};
  cost.struct_size = sizes[in.take<uint8_t>() % 5];
  const bool short_for_flags = cost.window_flags != 0 && cost.struct_size > CAD_COST_PARAMS_V1_1_SIZE &&
                               !CAD_HAS_FIELD(cad_cost_params_v1_t, &cost, window_right);
  cad_balance_input_v1_t input{};
  input.struct_size = sizeof input;
  input.ranks = views.data();
  input.num_ranks = world;
  input.num_servers = world;
  input.cost = &cost;
  try {
    const cad::balancer::Problem problem = cad::balancer::read_input(&input);
    if (!tables_ok) broken("the balancers accepted pieces CAD refused");
    if (short_for_flags) broken("cost params too short for the window they flag accepted");
    const cad::balancer::Ledger ledger(problem);  // the cost sums must not overflow (UBSan)
    // A window whose limits are at least every document's length hides no key: its costs are the
    // unwindowed ones (the cost model clamps such limits; it must never wrap).
    const cad::plan::ModelParams& m = problem.model;
    if (m.windowed()) {
      cad::plan::ModelParams plain = m;
      plain.window_left = plain.window_right = -1;
      for (const auto& rank : tables) {
        for (const auto& p : rank) {
          const bool hides = (m.window_left >= 0 && m.window_left < p.doc_len) ||
                             (!m.causal && m.window_right >= 0 && m.window_right < p.doc_len);
          const int64_t end = p.offset_in_doc + p.len;
          if (cad::plan::task_cost(p.offset_in_doc, end, p.doc_len, m) < 0) broken("a negative windowed cost");
          if (!hides && cad::plan::task_cost(p.offset_in_doc, end, p.doc_len, m) !=
                            cad::plan::task_cost(p.offset_in_doc, end, p.doc_len, plain)) {
            broken("a window hiding no key changed a task's cost");
          }
          const cad::plan::KvRange r = cad::plan::task_kv_range(p.offset_in_doc, end, p.doc_len, m);
          if (r.begin < 0 || r.end > p.doc_len || r.begin > r.end) broken("a task's KV range outside its document");
        }
      }
    }
  } catch (const cad::plugin::Failure& f) {
    if (f.status() == CAD_STATUS_ABI_MISMATCH) {
      if (!short_for_flags) broken("cost params refused as ABI_MISMATCH though they hold the window they flag");
    } else if (f.status() == CAD_STATUS_INVALID_ARGUMENT) {
      // A malformed window (left/right < -1, or right > 0 causal) is the caller's error.
      const bool bad_window = cost.window_flags != 0 && CAD_HAS_FIELD(cad_cost_params_v1_t, &cost, window_right) &&
                              (cost.window_left < -1 || cost.window_right < -1 || (cost.causal && cost.window_right > 0));
      if (tables_ok && !bad_window) broken("the balancers refused as INVALID_ARGUMENT what is no bad window");
    } else if (tables_ok && f.status() != CAD_STATUS_UNSUPPORTED) {
      broken("the balancers refused pieces CAD accepted");
    }
  }
  return 0;
}
