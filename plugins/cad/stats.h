// stats.h -- what get_stats_json reports about the last forward and the last backward: attention
// work per server, bytes moved per rank, and where the time went.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm.h"
#include "layout.h"
#include "validate.h"
#include "cad_balancer_v1.h"

namespace cad::cad_plugin {

struct ServerWork {
  int64_t q_rows = 0;         // the server batch's size, from the layout
  int64_t kv_rows = 0;
  int64_t segments = 0;       // the server batch's and those of the tasks it runs in place (layout.own)
  int64_t own_q_rows = 0;     // query rows of the tasks it runs in place, on its own tensors
  int64_t score_entries = 0;  // from the project's cost model (planning/plan_model.h)
  double forward_flops = 0.0;
};

struct CallStats {
  bool valid = false;
  bool replanned = false;  // backward: false when it reused the last forward's plan
  double plan_ms = 0.0, pack_ms = 0.0, exchange_ms = 0.0, compute_ms = 0.0, unpack_ms = 0.0, total_ms = 0.0;
  double compute_cpu_ms = 0.0;  // process CPU time of the server backend call
  double wait_ms = 0.0;         // after computing, waiting for every server to finish (imbalance shows here)
  std::vector<ServerWork> servers;
  uint64_t bytes_sent = 0, bytes_received = 0;  // this rank, all exchanges of the call
  std::vector<uint64_t> bytes_sent_by_rank, bytes_received_by_rank;
  // What the cost model predicts a forward moves (per rank, to and from other ranks): the measured
  // forward bytes should equal these.
  std::vector<int64_t> model_forward_bytes_sent, model_forward_bytes_received;
  double imbalance = 1.0;  // max / mean server cost
  int64_t workspace_bytes = 0;  // device memory of the plan (index tables) and of this call's scratch (CUDA path)
  int64_t saved_bytes = 0;      // device memory this forward keeps for its backward (CUDA path)
};

// The CUDA data path's exchanges as the GPU ran them (timing events around each all_to_all_v), summed since the
// instance was made over the exchanges that have completed: `comm_ms` the collectives' own time on the
// communication stream, `stall_ms` how long the calling stream waited for them (from the point where it waits --
// where it had its data ready, or with head groups where it joins an exchange started before the work it did
// meanwhile -- to the collective's end, 0 where that came first: the exposed part unless another stream had work).
struct ExchangeTimes {
  bool timed = false;     // a CUDA exchange ran on this instance
  int64_t exchanges = 0;  // completed and counted
  int64_t pending = 0;    // enqueued, not yet completed when last looked at
  int64_t untimed = 0;    // not timed (too many pending: stats never read)
  double comm_ms = 0.0, stall_ms = 0.0;
};

// The CUDA data path's calls as the GPU ran them (timing events on the calling stream), summed since the instance
// was made over the calls that have completed: per direction, `*_ms` from a call's first enqueued work to its last
// (exchanges, packing, the server's compute) and `*_server_ms` the server backend's compute inside it (the tasks
// run in place and the served batch, every head group). What the ranks' server times say against the plan's
// predicted balance, and what a call costs beside its compute, measured without synchronising.
struct CallTimes {
  bool timed = false;
  int64_t forwards = 0, backwards = 0;  // completed and counted
  int64_t pending = 0;                  // enqueued, not yet completed when last looked at
  int64_t untimed = 0;                  // not timed (too many pending: stats never read)
  double forward_ms = 0.0, forward_server_ms = 0.0, backward_ms = 0.0, backward_server_ms = 0.0;
};

struct Stats {
  int32_t rank = 0;
  int32_t world = 1;
  CallStats forward, backward;
  ExchangeTimes gpu_exchange;
  CallTimes gpu_calls;
  CallStats plan;  // the cost model's view of the last plan made with make_plan (no times but plan_ms)
};

// The work of every server (cost model over the step's plan) and the model's forward traffic.
void describe_step(const PieceTables& tables, const std::vector<cad_task_v1_t>& tasks, const Layout& layout,
                   const CallShape& shape, CallStats& call);

// Fills bytes_*_by_rank with one small all_gather (collective).
void gather_bytes(Comm& comm, CallStats& call);

std::string stats_json(const Stats& stats);
std::string stats_line(const char* phase, const CallStats& call, int32_t rank);  // for the debug log

}  // namespace cad::cad_plugin
