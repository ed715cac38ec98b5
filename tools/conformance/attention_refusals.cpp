// attention_refusals.cpp -- inputs the backend's capabilities exclude must be refused (UNSUPPORTED or
// INVALID_ARGUMENT, with a message) before any output is written.
#include "attention_internal.h"

namespace cad::conformance {

namespace {

// Calls forward (and backward, if `backward`) on a small batch of `spec` and expects a refusal.
void expect_refused(Backend& b, const CaseSpec& spec, bool forward, bool backward, const std::string& name,
                    Report& report) {
  std::seed_seq seed{7u, static_cast<uint32_t>(name.size())};
  std::mt19937_64 rng(seed);
  CaseSpec small = spec;
  small.layout = Layout::kKvPrefix;
  const AttentionProblem p = make_problem(small, rng);
  const std::vector<double> d_o = random_values(static_cast<size_t>(p.tq * p.hq * p.d), spec.type, rng);
  CallTensors t(*b.memory, p, spec.type, d_o);
  const auto judge = [&](const std::string& check, cad_status_t status, bool untouched) {
    const std::string error = last_error_of(b.life, b.ctx);
    std::string problem;
    if (status != CAD_STATUS_UNSUPPORTED && status != CAD_STATUS_INVALID_ARGUMENT) {
      problem += "returned " + status_name(status) + " (expected UNSUPPORTED or INVALID_ARGUMENT); ";
    }
    if (status != CAD_STATUS_OK && (error.empty() || error == "<NULL>")) problem += "no last_error message; ";
    if (!untouched) problem += "outputs were written; ";
    report.expect(problem.empty(), check, problem + "capabilities exclude " + spec.name());
  };
  if (forward) {
    cad_attention_forward_args_v1_t fa = t.forward_args(p);
    const cad_status_t status = b.table->forward(b.ctx, &fa);
    b.memory->synchronize();
    judge("refuse.forward." + name, status, t.forward_outputs_untouched());
  }
  if (backward) {
    // Inputs a correct forward would give are not needed: the call must be refused first.
    t.o.upload(std::vector<double>(t.o.numel(), 0.0));
    t.lse.upload(std::vector<double>(t.lse.numel(), 0.0));
    cad_attention_backward_args_v1_t ba = t.backward_args(p);
    const cad_status_t status = b.table->backward(b.ctx, &ba);
    b.memory->synchronize();
    judge("refuse.backward." + name, status, t.backward_outputs_untouched());
  }
}

}  // namespace

void check_capability_refusals(Backend& b, Report& report) {
  const int64_t main_d = main_head_dim(b);
  if (main_d == 0) return;
  const ElementType type = b.supports(ElementType::F32) ? ElementType::F32 : ElementType::BF16;
  if (!b.supports(type)) return;  // no dtype at all: already a failed capabilities check
  const bool causal = b.has(CAD_ATTENTION_CAP_CAUSAL);
  const bool backward = b.has(CAD_ATTENTION_CAP_BACKWARD);

  for (ElementType other : {ElementType::F32, ElementType::BF16}) {
    if (!b.supports(other)) {
      expect_refused(b, CaseSpec{Layout::kKvPrefix, other, causal, 2, 2, main_d}, true, backward,
                     std::string("dtype_") + element_name(other), report);
    }
  }
  if (!b.has(CAD_ATTENTION_CAP_GQA)) {
    expect_refused(b, CaseSpec{Layout::kKvPrefix, type, causal, 2, 1, main_d}, true, backward, "gqa", report);
  }
  // The smallest head dim the mask leaves out, and the one just above max_head_dim.
  std::vector<int64_t> dims;
  for (int64_t d = 16; d <= 512; d += 16) {
    if (!b.supports_head_dim(d)) {
      dims.push_back(d);
      break;
    }
  }
  const int64_t above = (b.caps.max_head_dim / 16 + 1) * 16;
  if (above <= 512 && !b.supports_head_dim(above) && (dims.empty() || dims[0] != above)) dims.push_back(above);
  for (int64_t d : dims) {
    expect_refused(b, CaseSpec{Layout::kKvPrefix, type, causal, 2, 2, d}, true, backward,
                   "head_dim_" + std::to_string(d), report);
  }
  if (!b.has(CAD_ATTENTION_CAP_NONCAUSAL)) {
    expect_refused(b, CaseSpec{Layout::kKvPrefix, type, false, 2, 2, main_d}, true, backward, "noncausal", report);
  }
  if (!b.has(CAD_ATTENTION_CAP_CAUSAL)) {
    expect_refused(b, CaseSpec{Layout::kKvPrefix, type, true, 2, 2, main_d}, true, backward, "causal", report);
  }
  if (!backward) {
    expect_refused(b, CaseSpec{Layout::kKvPrefix, type, causal, 2, 2, main_d}, false, true, "no_backward_capability",
                   report);
  }
}

}  // namespace cad::conformance
