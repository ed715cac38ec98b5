// step.cpp -- see step.h.
#include "step.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "plugin_support.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

namespace {

// What every rank tells the others about its call: fixed size, so one all_gather carries it.
struct RankHeader {
  int32_t status;
  int32_t matches_last_forward;
  int64_t num_pieces;
  int64_t tokens;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t bf16;
  int32_t causal;
  float softmax_scale;
  int64_t window_left;
  int32_t head_groups;
  CallTicket ticket;
  char message[240];
};

const char* dtype_of(const RankHeader& h) { return h.bf16 ? "bf16" : "fp32"; }

// Throws if rank r's call differs from rank 0's in anything that must be global.
void check_same_shape(const RankHeader& h0, const RankHeader& h, size_t rank) {
  if (h.num_q_heads != h0.num_q_heads || h.num_kv_heads != h0.num_kv_heads || h.head_dim != h0.head_dim) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("ranks disagree on the head layout: rank 0 has Hq=%d, Hkv=%d, D=%d but rank %zu has Hq=%d, "
                "Hkv=%d, D=%d",
                h0.num_q_heads, h0.num_kv_heads, h0.head_dim, rank, h.num_q_heads, h.num_kv_heads, h.head_dim));
  }
  if (h.bf16 != h0.bf16) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("ranks disagree on the dtype: rank 0 has %s, rank %zu has %s", dtype_of(h0), rank, dtype_of(h)));
  }
  if (h.causal != h0.causal) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         format("ranks disagree on causal: rank 0 has %d, rank %zu has %d", h0.causal, rank, h.causal));
  }
  if (h.window_left != h0.window_left) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("ranks disagree on window_left: rank 0 has %lld, rank %zu has %lld",
                                             static_cast<long long>(h0.window_left), rank,
                                             static_cast<long long>(h.window_left)));
  }
  if (h.head_groups != h0.head_groups) {  // the exchanges of a grouped call differ in number and size
    fail(CAD_STATUS_INVALID_CONFIG, format("ranks disagree on the plugin's head_groups: rank 0 has %d, rank %zu has %d",
                                           h0.head_groups, rank, h.head_groups));
  }
  if (std::memcmp(&h.softmax_scale, &h0.softmax_scale, sizeof(float)) != 0) {
    fail(CAD_STATUS_INVALID_ARGUMENT, format("ranks disagree on softmax_scale: rank 0 has %.9g, rank %zu has %.9g",
                                             h0.softmax_scale, rank, h.softmax_scale));
  }
}

PieceTables gather_piece_tables(Comm& comm, const cad_piece_v1_t* pieces, const std::vector<int64_t>& counts) {
  const int64_t max_pieces = *std::max_element(counts.begin(), counts.end());
  PieceTables tables(counts.size());
  if (max_pieces == 0) return tables;
  // all_gather needs equal sizes: every rank pads its table to the longest one.
  std::vector<cad_piece_v1_t> mine(static_cast<size_t>(max_pieces), cad_piece_v1_t{0, 0, 0, 0});
  const size_t my_count = static_cast<size_t>(counts[static_cast<size_t>(comm.rank())]);
  if (my_count > 0) std::copy(pieces, pieces + my_count, mine.begin());
  std::vector<cad_piece_v1_t> all(static_cast<size_t>(max_pieces) * counts.size());
  comm.all_gather(mine.data(), mine.size() * sizeof(cad_piece_v1_t), all.data());
  for (size_t rank = 0; rank < counts.size(); ++rank) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>(rank * static_cast<size_t>(max_pieces));
    tables[rank].assign(begin, begin + counts[rank]);
  }
  return tables;
}

std::vector<cad_task_v1_t> run_balancer(const BalancerRef& balancer, const PieceTables& tables,
                                        const CallShape& shape, const PlanKnobs& knobs) {
  std::vector<cad_rank_pieces_v1_t> ranks(tables.size());
  for (size_t r = 0; r < tables.size(); ++r) {
    ranks[r].pieces = tables[r].data();
    ranks[r].num_pieces = static_cast<int64_t>(tables[r].size());
  }
  cad_cost_params_v1_t cost{};
  cost.struct_size = sizeof(cost);
  cost.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit
  cost.window_left = shape.window_left;  // the balancer prices windowed tasks (plan_model.h)
  cost.window_right = -1;
  cost.num_q_heads = shape.num_q_heads;
  cost.num_kv_heads = shape.num_kv_heads;
  cost.head_dim = shape.head_dim;
  cost.bytes_per_element = static_cast<int32_t>(shape.element_bytes());
  cost.causal = shape.causal ? 1 : 0;
  cost.min_shard_tokens = knobs.min_shard_tokens;
  cost.memory_cap_bytes = knobs.memory_cap_bytes;
  cad_balance_input_v1_t input{};
  input.struct_size = sizeof(input);
  input.ranks = ranks.data();
  input.num_ranks = static_cast<int32_t>(tables.size());
  input.num_servers = input.num_ranks;
  input.cost = &cost;

  cad_plan_v1_t* plan = nullptr;
  const cad_status_t status = balancer.table->plan(balancer.instance, &input, &plan);
  if (status != CAD_STATUS_OK) {
    const char* message = balancer.table->last_error(balancer.instance);
    fail(status, "balancer instance '" + balancer.name + "': " + (message != nullptr ? message : "(no message)"));
  }
  if (plan == nullptr) fail(CAD_STATUS_INTERNAL, "balancer instance '" + balancer.name + "' returned no plan");
  std::vector<cad_task_v1_t> tasks;
  std::string problem;
  if (plan->format_version != CAD_PLAN_FORMAT_VERSION || plan->num_servers != input.num_servers ||
      plan->num_tasks < 0 || (plan->num_tasks > 0 && plan->tasks == nullptr)) {
    problem = format("plan format %u with %d servers and %lld tasks (expected format %d, %d servers)",
                     plan->format_version, plan->num_servers, static_cast<long long>(plan->num_tasks),
                     CAD_PLAN_FORMAT_VERSION, input.num_servers);
  } else {
    tasks.assign(plan->tasks, plan->tasks + plan->num_tasks);
  }
  balancer.table->release_plan(balancer.instance, plan);
  if (!problem.empty()) fail(CAD_STATUS_INTERNAL, "balancer instance '" + balancer.name + "': " + problem);
  return tasks;
}

}  // namespace

AgreedCall agree_on_call(Comm& comm, const LocalCall& local, const char* what) {
  RankHeader mine{};
  mine.status = local.status;
  mine.matches_last_forward = local.matches_last_forward ? 1 : 0;
  mine.ticket = local.ticket;
  mine.head_groups = local.head_groups;
  if (local.status == CAD_STATUS_OK) {
    mine.num_pieces = local.num_pieces;
    mine.tokens = local.shape.tokens;
    mine.num_q_heads = local.shape.num_q_heads;
    mine.num_kv_heads = local.shape.num_kv_heads;
    mine.head_dim = local.shape.head_dim;
    mine.bf16 = local.shape.bf16 ? 1 : 0;
    mine.causal = local.shape.causal ? 1 : 0;
    mine.softmax_scale = local.shape.softmax_scale;
    mine.window_left = local.shape.window_left;
  } else {
    plugin::copy_message(local.message, mine.message, sizeof(mine.message));
  }
  const std::vector<RankHeader> all = comm.all_gather_value(mine);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank].status != CAD_STATUS_OK) {
      RankHeader h = all[rank];
      h.message[sizeof(h.message) - 1] = '\0';
      fail(h.status, format("%s: rank %zu: %s", what, rank, h.message));
    }
  }
  AgreedCall agreed;
  std::vector<CallTicket> tickets;
  for (size_t rank = 0; rank < all.size(); ++rank) {
    check_same_shape(all[0], all[rank], rank);
    tickets.push_back(all[rank].ticket);
    agreed.num_pieces.push_back(all[rank].num_pieces);
    if (agreed.first_rank_not_matching < 0 && all[rank].matches_last_forward == 0) {
      agreed.first_rank_not_matching = static_cast<int32_t>(rank);
    }
  }
  check_tickets(tickets, what);
  agreed.shape = local.shape;
  return agreed;
}

Step prepare_step(Comm& comm, const BalancerRef& balancer, const AgreedCall& call, const cad_piece_v1_t* pieces,
                  const PlanKnobs& knobs, bool own_in_place, const std::function<void(Step&)>& finish) {
  Step step;
  step.shape = call.shape;
  step.tables = gather_piece_tables(comm, pieces, call.num_pieces);
  // Pure and identical on every rank from here: same data, same verdict, no communication needed.
  check_piece_tables(step.tables);
  cad_status_t status = CAD_STATUS_OK;
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  try {
    step.tasks = run_balancer(balancer, step.tables, step.shape, knobs);
    check_plan(step.tables, step.tasks, comm.world(), balancer.name);
    step.layout = build_layout(step.tables, step.tasks, step.shape.causal, step.shape.window_left, own_in_place);
    step.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (finish) finish(step);
  } catch (const plugin::Failure& f) {
    status = f.status();
    message = f.what();
  } catch (const std::bad_alloc&) {
    status = CAD_STATUS_OUT_OF_MEMORY;
    message = "out of memory while planning";
  }
  // The balancer is deterministic, so it fails everywhere or nowhere; this agreement is insurance
  // against a rank-local failure (memory) turning into a hang at the next collective.
  agree(comm, status, message, "planning");
  return step;
}

}  // namespace cad::cad_plugin
