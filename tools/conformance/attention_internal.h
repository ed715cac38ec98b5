// attention_internal.h -- pieces of the attention runner shared by its files: the backend under test,
// the random batches, and one call's tensors. Internal to the kit.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention_tensors.h"
#include "kit_internal.h"
#include "oracle.h"

namespace cad::conformance {

struct Backend {
  const cad_attention_v1_t* table = nullptr;
  void* ctx = nullptr;
  Lifecycle life;
  cad_attention_capabilities_v1_t caps{};
  Memory* memory = nullptr;
  bool supports(ElementType type) const;
  bool supports_head_dim(int64_t d) const;
  bool has(uint32_t flag) const { return (caps.flags & flag) != 0; }
};

// The kinds of segment tables the runner draws (see attention_batches.cpp).
enum class Layout {
  kVarlen,        // documents of random lengths 1..40 with gaps in Q (uncovered rows) and a q_len 0 segment
  kKvPrefix,      // q_len < kv_len: queries attend to a longer KV prefix (CAD's tail shards)
  kSharedKv,      // several segments of one document read one shared KV copy
  kSingleTokens,  // every segment one query; KV of length 1 or longer
  kEmpty,         // Tq = Tk = 0, no segments
  kUncoveredOnly  // Tq, Tk > 0 but no segments: every output row is "not covered"
};
const char* layout_name(Layout layout);

struct CaseSpec {
  Layout layout = Layout::kVarlen;
  ElementType type = ElementType::F32;
  bool causal = true;
  int64_t hq = 2, hkv = 2, d = 64;
  int64_t window_left = -1, window_right = -1;  // sliding window (CAD_ATTENTION_CAP_WINDOW only)
  std::string name() const;  // e.g. "varlen.causal.fp32.h2x2.d64", "...d64.window3x-1"
};

// A random problem for `spec`; inputs already rounded to spec.type.
AttentionProblem make_problem(const CaseSpec& spec, std::mt19937_64& rng);
std::vector<double> random_values(size_t n, ElementType type, std::mt19937_64& rng);

// The tensors of one forward + backward call on the backend's device, inputs uploaded, outputs
// filled with the sentinel.
struct CallTensors {
  CallTensors(Memory& memory, const AttentionProblem& problem, ElementType type, const std::vector<double>& d_o);
  Tensor q, k, v, o, lse, d_o, d_q, d_k, d_v;
  cad_attention_forward_args_v1_t forward_args(const AttentionProblem& problem);
  cad_attention_backward_args_v1_t backward_args(const AttentionProblem& problem);
  void fill_outputs_with_sentinel();
  bool forward_outputs_untouched() const;   // O and LSE still hold the sentinel
  bool backward_outputs_untouched() const;  // dQ, dK, dV still hold the sentinel
};

// The head dim most cases use: 64 if supported, else the smallest the mask lists (0 if none).
int64_t main_head_dim(const Backend& backend);

// The runner's parts, one file each.
void check_numerics(Backend& backend, const Options& options, Report& report);
void check_capability_refusals(Backend& backend, Report& report);
void check_argument_errors(Backend& backend, Report& report);

}  // namespace cad::conformance
