// diet_batches.h -- CAD's real kernel diet: the server batches that CAD hands its attention backend when
// the balancers plan Pretrain-recipe batches. One config = (balancer, servers, tokens per server): the
// DistCA recipe samples a batch (tools/workload sample_batch), the balancer plugin plans it through
// the ABI (as CAD calls it), and CAD's own layout (plugins/cad/layout.h) turns the plan into one batch per
// server: segments (q_offset, q_len, kv_offset, kv_len), bottom-right causal, a document's segments on a
// server sharing one copy of its KV prefix. A few servers per config are kept (lightest, median and
// heaviest by score entries) so that the set stays small enough to time every round on one GPU.
//
// The text format (bench/kernels/diet_batches.txt, read by diet_bench.py and read_diet_file below):
//   lines starting with '#' are comments (the generating command, the fields);
//   every other line is one server batch: NAME TQ TK NSEG then NSEG words "q_offset,q_len,kv_offset,kv_len".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cad_attention_v1.h"
#include "cad_balancer_v1.h"
#include "../../plugins/cad/layout.h"  // CAD's layout (tools/simulate has its own layout.h)

namespace cad::diet {

// One server's batch as the kernel benchmark runs it.
struct DietBatch {
  std::string name;  // e.g. prefix_aware_s8_t128k_heaviest_r5
  int64_t tq = 0;    // Q rows
  int64_t tk = 0;    // K/V rows
  std::vector<cad_segment_v1_t> segments;
};

// Which servers of a config are kept: the lightest, median and heaviest by score entries ("extremes"),
// one of them, or all.
enum class Pick { kExtremes, kLightest, kMedian, kHeaviest, kAll };

// Every (balancer, servers, tokens) combination of the lists, keeping `pick` of each.
struct DietSet {
  std::vector<std::string> balancers;
  std::vector<int32_t> servers;
  std::vector<int64_t> tokens;  // per server (the recipe's context)
  Pick pick = Pick::kExtremes;
};

// "BALANCERS:SERVERS:TOKENS:PICK", e.g. "prefix_aware,distca:4,8:64k,131072:median" (tokens as integers
// or with a k suffix = x1024; PICK one of extremes, lightest, median, heaviest, all). Throws
// std::runtime_error saying what part was expected.
DietSet parse_diet_set(const std::string& spec);

// One planned config: the sampled batch, the balancer's plan and CAD's layout of it.
struct PlannedConfig {
  std::string balancer;
  int32_t servers = 0;
  int64_t tokens = 0;
  Pick pick = Pick::kExtremes;
  cad::cad_plugin::PieceTables pieces;
  std::vector<cad_task_v1_t> tasks;
  cad::cad_plugin::Layout layout;
};

struct GenerateOptions {
  std::vector<DietSet> sets;
  uint64_t seed = 1;
  std::string plugin_path;  // colon-separated directories searched first for the balancer plugins
  // The cost parameters the balancers plan with (bytes per row enter their traffic terms).
  int32_t num_q_heads = 32, num_kv_heads = 8, head_dim = 128;
};

// Causal score entries of one bottom-right aligned segment: q*kv - q*(q-1)/2 (FLOPs = 4*d*Hq*entries).
int64_t segment_entries(const cad_segment_v1_t& s);
int64_t batch_entries(const std::vector<cad_segment_v1_t>& segments);

// Samples (one batch per servers x tokens, the same for every balancer), plans (through the plugin, found
// by name in options.plugin_path or the default plugin dirs) and lays out every config of every set, in
// the order set, balancer, servers, tokens. Throws std::runtime_error naming the config on a refusal.
std::vector<PlannedConfig> plan_configs(const std::vector<int64_t>& lengths, const GenerateOptions& options);

// The servers kept from one config, with their labels ("lightest", "median", "heaviest", or "all"), in
// that order: servers sorted by (score entries, server index), so ties are broken the same way every
// time; a server is listed once even when it is, say, both the lightest and the median.
struct PickedServer {
  int32_t server;
  std::string label;
};
std::vector<PickedServer> pick_servers(const cad::cad_plugin::Layout& layout, Pick pick);

// The kept batches of every config, named BALANCER_sS_tTk_LABEL_rSERVER.
std::vector<DietBatch> diet_batches(const std::vector<PlannedConfig>& configs);

// One batch as a line of the text format (no newline), and back. parse_diet_line throws
// std::runtime_error naming `where` (file:line) and what was expected.
std::string format_diet_line(const DietBatch& batch);
DietBatch parse_diet_line(const std::string& line, const std::string& where);
// Every batch of a file (comments and blank lines skipped); throws naming the file and line.
std::vector<DietBatch> read_diet_file(const std::string& path);

// Checks what the kernels require of a batch: every segment has q_len >= 1, kv_len >= q_len (causal),
// and lies inside [0, tq) x [0, tk). Throws std::runtime_error naming the batch and the segment.
void check_diet_batch(const DietBatch& batch);

}  // namespace cad::diet
