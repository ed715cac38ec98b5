// cmd_demo_cad.cpp -- see demo_cad.h.
#include "demo_cad.h"

#include <cstdarg>
#include <cstdio>

#include "demo_compare.h"
#include "demo_report.h"

namespace cad::demo {
namespace {

// Progress and headers: rank 0 only, flushed at once (the run takes a while, and mpirun forwards
// output line by line).
struct Progress {
  bool enabled = true;
  void line(const char* format, ...) const __attribute__((format(printf, 2, 3))) {
    if (!enabled) return;
    va_list args;
    va_start(args, format);
    std::vprintf(format, args);
    va_end(args);
    std::printf("\n");
    std::fflush(stdout);
  }
};

// One stack per balancer, all alive until the end: the communicator of the first one carries the final
// gather, and unloading the MPI plugin between stacks would finalise MPI, which cannot be initialised
// again in the process.
cad::Host build_stack(const CadDemoOptions& options, const CadStack& stack, const std::string& balancer) {
  const std::string json = with_balancer(stack, balancer);
  cad_host_options_v1_t host_options{};
  host_options.struct_size = sizeof host_options;
  host_options.config_json = json.c_str();
  host_options.config_path = options.config.c_str();
  host_options.search_path = options.search_path.empty() ? nullptr : options.search_path.c_str();
  return cad::Host(host_options);
}

// The demo feeds fp32 CPU tensors as pieces, causal or not, GQA when Hq != Hkv, and needs backward.
void check_capabilities(const cad_attention_v1_t* table, void* instance, const Shape& shape, const std::string& name) {
  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof caps;
  require(table->get_capabilities(instance, &caps), table, instance, "get_capabilities");
  std::string missing;
  if ((caps.flags & CAD_ATTENTION_CAP_PIECES) == 0) missing += " pieces";
  if (caps.device_type != CAD_DEVICE_CPU) missing += " CPU tensors";
  if ((caps.dtype_mask & CAD_ATTENTION_DTYPE_FP32) == 0) missing += " fp32";
  if ((caps.flags & (shape.causal ? CAD_ATTENTION_CAP_CAUSAL : CAD_ATTENTION_CAP_NONCAUSAL)) == 0) {
    missing += shape.causal ? " causal" : " non-causal";
  }
  if (shape.heads != shape.kv_heads && (caps.flags & CAD_ATTENTION_CAP_GQA) == 0) missing += " GQA";
  if ((caps.flags & CAD_ATTENTION_CAP_BACKWARD) == 0) missing += " backward";
  if (!missing.empty()) {
    throw cad::Error(CAD_STATUS_UNSUPPORTED, "the attention instance '" + name + "' lacks what the demo needs:" + missing);
  }
}

}  // namespace

int run_cad_demo(const CadDemoOptions& options, const CadStack& stack) {
  // Every stack is built before anything runs, so that a balancer that does not load fails at once.
  std::vector<cad::Host> hosts;
  hosts.reserve(options.balancers.size());
  for (const auto& balancer : options.balancers) {
    hosts.push_back(build_stack(options, stack, balancer));
    const auto [table, instance] = hosts.back().attention();
    check_capabilities(table, instance, options.shape, stack.attention);
  }
  const Communicator comm = stack.communicator.empty() ? first_communicator(hosts.front())
                                                       : communicator_named(hosts.front(), stack.communicator);
  const Progress progress{comm.rank == 0};

  const Batch batch = make_batch(options.batch, comm.world_size);
  const Shape& shape = options.shape;
  progress.line("cad demo: core attention disaggregation on %d rank%s (CPU), config %s", comm.world_size,
                comm.world_size == 1 ? "" : "s", options.config.c_str());
  for (const auto& note : batch.notes) progress.line("NOTE: %s", note.c_str());
  progress.line("batch     %s, seed %llu: %d x %lld tokens, %lld documents", batch.source.c_str(),
                static_cast<unsigned long long>(options.batch.seed), comm.world_size,
                static_cast<long long>(options.batch.context), static_cast<long long>(batch.documents));
  progress.line("shape     Hq=%lld Hkv=%lld D=%lld fp32, %s", static_cast<long long>(shape.heads),
                static_cast<long long>(shape.kv_heads), static_cast<long long>(shape.head_dim),
                shape.causal ? "causal" : "non-causal");
  std::string names;
  for (const auto& b : options.balancers) names += (names.empty() ? "" : ", ") + b;
  progress.line("balancers %s (instance '%s' of the config; the first is the baseline)", names.c_str(),
                stack.balancer.c_str());

  const std::vector<cad_piece_v1_t>& pieces = batch.pieces[static_cast<size_t>(comm.rank)];
  Inputs inputs = fill_inputs(pieces, shape.heads, shape.kv_heads, shape.head_dim, options.batch.seed);

  std::vector<BalancerRun> runs;
  const size_t n = options.balancers.size();
  for (size_t b = 0; b < n; ++b) {
    const std::string& balancer = options.balancers[b];
    const auto [table, instance] = hosts[b].attention();
    progress.line("[%zu/%zu] %-12s forward + backward ...", b + 1, n, balancer.c_str());
    runs.push_back(run_balancer(balancer, table, instance, pieces, inputs, shape, comm));
    progress.line("[%zu/%zu] %-12s done: forward %.1f ms, backward %.1f ms (rank 0)", b + 1, n, balancer.c_str(),
                  runs.back().forward_ms, runs.back().backward_ms);
  }
  if (options.inject_difference > 0 && comm.rank == 0) {
    progress.line("injecting a difference of %.3g x max|O| into %s's O on rank 0 (checks the check)",
                  options.inject_difference, runs.back().balancer.c_str());
    inject_difference(runs.back(), options.inject_difference);
  }
  const int status = report(comm, batch, runs);
  if (comm.world_size == 1) {
    // Started without mpirun: a world of one has nothing to balance, so "imbalance 1.000 -> 1.000" is
    // all it can show. Say how to see the real job.
    progress.line("\nNOTE: one rank, so there is nothing to balance (imbalance 1.000 -> 1.000). Run it on several:\n"
                  "  mpirun -np 4 cad demo --config %s\n"
                  "adding --oversubscribe where the machine has fewer than 4 cores and --allow-run-as-root as root.",
                  options.config.c_str());
  }
  return status;
}

}  // namespace cad::demo
