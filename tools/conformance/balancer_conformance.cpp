// balancer_conformance.cpp -- the balancer runner: valid, deterministic plans on random piece tables
// for several server counts, and refusals of malformed inputs.
#include <cstring>
#include <functional>
#include <map>

#include "kit_internal.h"
#include "plan_checks.h"

namespace cad::conformance {

namespace {

cad_plan_v1_t* const kUntouchedPlan = reinterpret_cast<cad_plan_v1_t*>(uintptr_t{0x5eed});

struct Balancer {
  const cad_balancer_v1_t* table;
  void* ctx;
  Lifecycle life;
};

cad_cost_params_v1_t cost_params(bool causal, int64_t min_shard) {
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof(cost);
  cost.num_q_heads = 4;
  cost.num_kv_heads = 2;
  cost.head_dim = 64;
  cost.bytes_per_element = 2;
  cost.causal = causal ? 1 : 0;
  cost.min_shard_tokens = min_shard;
  cost.memory_cap_bytes = 0;
  return cost;
}

cad_balance_input_v1_t input_for(PieceTables& tables, int num_servers, const cad_cost_params_v1_t* cost) {
  tables.refresh_views();
  cad_balance_input_v1_t input{};
  input.struct_size = sizeof(input);
  input.ranks = tables.views.data();
  input.num_ranks = static_cast<int32_t>(tables.views.size());
  input.num_servers = num_servers;
  input.cost = cost;
  return input;
}

bool same_plan(const cad_plan_v1_t& a, const cad_plan_v1_t& b) {
  return a.num_tasks == b.num_tasks && a.num_servers == b.num_servers && a.format_version == b.format_version &&
         (a.num_tasks == 0 ||
          std::memcmp(a.tasks, b.tasks, static_cast<size_t>(a.num_tasks) * sizeof(cad_task_v1_t)) == 0);
}

// Plans one input three times (twice on the first context, once on the second) and returns the first
// problem found, or "".
std::string plan_and_compare(const Balancer& first, const Balancer& second, PieceTables& tables, int servers,
                             const cad_cost_params_v1_t& cost, std::string* determinism) {
  const cad_balance_input_v1_t input = input_for(tables, servers, &cost);
  cad_plan_v1_t* plans[3] = {nullptr, nullptr, nullptr};
  const Balancer* on[3] = {&first, &first, &second};
  std::string problem;
  for (int i = 0; i < 3 && problem.empty(); ++i) {
    const cad_status_t status = on[i]->table->plan(on[i]->ctx, &input, &plans[i]);
    if (status != CAD_STATUS_OK || plans[i] == nullptr) {
      problem = "plan returned " + status_name(status) + ": " + last_error_of(on[i]->life, on[i]->ctx);
      plans[i] = status == CAD_STATUS_OK ? plans[i] : nullptr;
    } else if (plans[i]->struct_size < sizeof(cad_plan_v1_t)) {
      problem = "plan struct_size " + std::to_string(plans[i]->struct_size) + " < " + std::to_string(sizeof(cad_plan_v1_t));
    } else if (i == 0) {
      problem = plan_violation(tables, servers, *plans[0]);
    } else if (!same_plan(*plans[0], *plans[i]) && determinism->empty()) {
      *determinism = i == 1 ? "a second call on the same context gave a different plan"
                            : "a second context gave a different plan";
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (plans[i] != nullptr) on[i]->table->release_plan(on[i]->ctx, plans[i]);
  }
  return problem;
}

void check_plans(const Balancer& first, const Balancer& second, const Options& options, Report& report) {
  const int repeats = options.quick ? 2 : 6;
  for (int servers : {1, 2, 3, 4, 8}) {
    std::string problem, determinism;
    int64_t docs = 0;
    for (int r = 0; r < repeats && problem.empty(); ++r) {
      std::seed_seq seed{static_cast<uint32_t>(options.seed), static_cast<uint32_t>(options.seed >> 32),
                         static_cast<uint32_t>(servers), static_cast<uint32_t>(r)};
      std::mt19937_64 rng(seed);
      const int empty = servers >= 3 ? static_cast<int>(r % 2) : 0;
      PieceTables tables = random_piece_tables(servers, empty, rng);
      docs += tables.num_documents();
      const cad_cost_params_v1_t cost = cost_params(r % 2 == 0, r % 3 == 2 ? 16 : 0);
      problem = plan_and_compare(first, second, tables, servers, cost, &determinism);
      if (!problem.empty()) problem = "case " + std::to_string(r) + ": " + problem;
    }
    const std::string suffix = ".servers_" + std::to_string(servers);
    if (problem.empty()) {
      report.pass("plan.valid" + suffix, std::to_string(docs) + " documents over " + std::to_string(repeats) + " cases");
    } else {
      report.fail("plan.valid" + suffix, problem);
    }
    if (problem.empty()) report.expect(determinism.empty(), "plan.deterministic" + suffix, determinism);
  }
  // Every rank empty: a valid, empty plan.
  PieceTables nothing;
  nothing.ranks.resize(3);
  std::string determinism;
  const cad_cost_params_v1_t cost = cost_params(true, 0);
  const std::string problem = plan_and_compare(first, second, nothing, 3, cost, &determinism);
  report.expect(problem.empty(), "plan.all_ranks_empty", problem);
}

// A malformed input must be refused with INVALID_ARGUMENT and a message, leaving *out_plan untouched.
void expect_refused(const Balancer& b, const std::string& name, const cad_balance_input_v1_t* input, bool null_out,
                    Report& report) {
  cad_plan_v1_t* plan = kUntouchedPlan;
  const cad_status_t status = b.table->plan(b.ctx, input, null_out ? nullptr : &plan);
  std::string problem;
  if (status != CAD_STATUS_INVALID_ARGUMENT) problem += "returned " + status_name(status) + ", expected INVALID_ARGUMENT; ";
  const std::string error = last_error_of(b.life, b.ctx);
  if (status != CAD_STATUS_OK && (error.empty() || error == "<NULL>")) problem += "no last_error message; ";
  if (plan != kUntouchedPlan) {
    problem += "*out_plan was modified; ";
    if (status == CAD_STATUS_OK && plan != nullptr) b.table->release_plan(b.ctx, plan);
  }
  report.expect(problem.empty(), "refuse." + name, problem.substr(0, problem.size() >= 2 ? problem.size() - 2 : 0));
}

// The first document with at least two pieces, as (rank, index) of its first piece found.
bool find_split_document(const PieceTables& tables, size_t* rank, size_t* index) {
  std::map<int64_t, int> count;
  for (const auto& r : tables.ranks) {
    for (const auto& p : r) count[p.doc_id]++;
  }
  for (size_t r = 0; r < tables.ranks.size(); ++r) {
    for (size_t i = 0; i < tables.ranks[r].size(); ++i) {
      if (count[tables.ranks[r][i].doc_id] >= 2 && tables.ranks[r][i].len >= 2) {
        *rank = r;
        *index = i;
        return true;
      }
    }
  }
  return false;
}

void check_bad_inputs(const Balancer& b, const Options& options, Report& report) {
  std::seed_seq seed{static_cast<uint32_t>(options.seed), 99u};
  std::mt19937_64 rng(seed);
  const PieceTables good = random_piece_tables(3, 0, rng);
  const cad_cost_params_v1_t cost = cost_params(true, 0);
  size_t rank = 0, index = 0;
  if (!report.expect(find_split_document(good, &rank, &index), "refuse.setup",
                     "the kit's random table has no document split into pieces")) {
    return;
  }
  using Edit = std::function<void(PieceTables&)>;
  const std::pair<const char*, Edit> edits[] = {
      {"overlapping_pieces",
       [&](PieceTables& t) {
         cad_piece_v1_t extra = t.ranks[rank][index];
         extra.len = 1;  // its first token, a second time
         t.ranks[(rank + 1) % t.ranks.size()].push_back(extra);
       }},
      {"gap", [&](PieceTables& t) { t.ranks[rank][index].len -= 1; }},
      {"disagreeing_doc_len", [&](PieceTables& t) { t.ranks[rank][index].doc_len += 1; }},
      {"negative_length", [&](PieceTables& t) { t.ranks[rank][index].len = -1; }},
      {"zero_length", [&](PieceTables& t) { t.ranks[rank].push_back(cad_piece_v1_t{t.ranks[rank][index].doc_id,
                                                                                   t.ranks[rank][index].doc_len, 0, 0}); }},
      {"negative_offset", [&](PieceTables& t) { t.ranks[rank][index].offset_in_doc = -1; }},
      {"piece_past_doc_end", [&](PieceTables& t) {
         cad_piece_v1_t& p = t.ranks[rank][index];
         t.ranks[rank].push_back(cad_piece_v1_t{p.doc_id, p.doc_len, p.doc_len, 1});
       }},
  };
  for (const auto& [name, edit] : edits) {
    PieceTables bad = good;
    edit(bad);
    const cad_balance_input_v1_t input = input_for(bad, 3, &cost);
    expect_refused(b, name, &input, false, report);
  }
  PieceTables tables = good;
  cad_balance_input_v1_t input = input_for(tables, 3, &cost);
  expect_refused(b, "input_null", nullptr, false, report);
  expect_refused(b, "out_plan_null", &input, true, report);
  input.num_servers = 0;
  expect_refused(b, "zero_servers", &input, false, report);
  input = input_for(tables, 3, &cost);
  input.ranks = nullptr;
  expect_refused(b, "ranks_null", &input, false, report);
  input = input_for(tables, 3, &cost);
  input.cost = nullptr;
  expect_refused(b, "cost_null", &input, false, report);
}

}  // namespace

void run_balancer_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report) {
  if (!report.expect(plugin != nullptr && plugin->kind == CAD_PLUGIN_KIND_BALANCER && plugin->balancer != nullptr,
                     "balancer.kind", "not a balancer plugin")) {
    return;
  }
  try {
    TestServices services;
    services.add_instances(options.instances);
    {
      std::unique_ptr<Instance> first = create_for_run(plugin, options, services, "balancer.create", report);
      if (!first) return;
      std::unique_ptr<Instance> second = create_for_run(plugin, options, services, "balancer.create_second", report);
      if (!second) return;
      Lifecycle life;
      lifecycle_of(plugin, &life);
      const Balancer a{plugin->balancer, first->get(), life}, b{plugin->balancer, second->get(), life};
      a.table->release_plan(a.ctx, nullptr);
      report.pass("release_plan.null");
      check_plans(a, b, options, report);
      check_bad_inputs(a, options, report);
    }
    report.expect(services.outstanding_bytes() == 0, "balancer.no_leak",
                  std::to_string(services.outstanding_bytes()) + " bytes of host allocations still held after destroy");
  } catch (const std::exception& e) {
    report.fail("balancer.kit_error", std::string("the kit could not finish: ") + e.what());
  }
}

}  // namespace cad::conformance
