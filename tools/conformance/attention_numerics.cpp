// attention_numerics.cpp -- forward and backward of every supported configuration against the kit's
// fp64 oracle: max relative error (max|got-want| / max|want|; absolute where the oracle is zero, oracle.h)
// within 1e-5 for fp32, 1e-2 for bf16.
#include <cmath>
#include <cstdio>
#include <limits>

#include "attention_internal.h"

namespace cad::conformance {

namespace {

std::string format_error(const char* what, double error) {
  char text[64];
  std::snprintf(text, sizeof(text), "%s %.2e", what, error);
  return text;
}

// LSE: rows the oracle marks -inf must be exactly -inf; the rest compare relative to max(|lse|, 1).
double lse_error(const std::vector<double>& got, const std::vector<double>& want) {
  std::vector<double> g, w;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      if (!(std::isinf(got[i]) && got[i] < 0)) return std::numeric_limits<double>::infinity();
    } else {
      g.push_back(got[i]);
      w.push_back(want[i]);
    }
  }
  return max_relative_error(g.data(), w.data(), g.size(), 1.0);
}

std::string call_failure(const Backend& b, cad_status_t status) {
  return "returned " + status_name(status) + ": " + last_error_of(b.life, b.ctx);
}

// Rows of O no segment covers must be exactly 0 and their LSE -inf (checked on their own so that a
// backend that skips them is named for it).
void check_uncovered_rows(const AttentionProblem& p, const std::vector<double>& o, const std::vector<double>& lse,
                          const std::string& name, Report& report) {
  std::vector<bool> covered(static_cast<size_t>(p.tq), false);
  for (const cad_segment_v1_t& s : p.segments) {
    for (int64_t r = s.q_offset; r < s.q_offset + s.q_len; ++r) covered[r] = true;
  }
  int64_t uncovered = 0, wrong = 0;
  for (int64_t r = 0; r < p.tq; ++r) {
    if (covered[r]) continue;
    ++uncovered;
    bool ok = true;
    for (int64_t i = 0; i < p.hq * p.d; ++i) ok = ok && o[r * p.hq * p.d + i] == 0.0;
    for (int64_t h = 0; h < p.hq; ++h) ok = ok && std::isinf(lse[h * p.tq + r]) && lse[h * p.tq + r] < 0;
    wrong += ok ? 0 : 1;
  }
  if (uncovered == 0) return;
  report.expect(wrong == 0, name, std::to_string(wrong) + " of " + std::to_string(uncovered) +
                                      " uncovered rows do not have O = 0 and LSE = -inf");
}

void run_case(Backend& b, const CaseSpec& spec, std::mt19937_64& rng, Report& report) {
  const AttentionProblem p = make_problem(spec, rng);
  const std::vector<double> d_o = random_values(static_cast<size_t>(p.tq * p.hq * p.d), spec.type, rng);
  CallTensors t(*b.memory, p, spec.type, d_o);
  const double tolerance = spec.type == ElementType::F32 ? 1e-5 : 1e-2;

  const std::string forward_name = "forward." + spec.name();
  cad_attention_forward_args_v1_t fa = t.forward_args(p);
  cad_status_t status = b.table->forward(b.ctx, &fa);
  b.memory->synchronize();
  if (status != CAD_STATUS_OK) {
    report.fail(forward_name, call_failure(b, status));
    return;
  }
  const ForwardResult want = oracle_forward(p);
  const std::vector<double> o = t.o.download(), lse = t.lse.download();
  const ResultScales scales = result_scales(p, d_o);  // for tensors the oracle makes exactly zero
  const double o_error = max_error(o, want.o, 1e-6, scales.o);
  const double l_error = lse_error(lse, want.lse);
  const std::string detail = format_error("O", o_error) + ", " + format_error("LSE", l_error) + " (tolerance " +
                             format_error("", tolerance).substr(1) + ")";
  if (o_error <= tolerance && l_error <= tolerance) {
    report.pass(forward_name, detail);
  } else {
    report.fail(forward_name, detail);
  }
  check_uncovered_rows(p, o, lse, "forward.uncovered_rows." + spec.name(), report);

  if (!b.has(CAD_ATTENTION_CAP_BACKWARD)) return;
  const std::string backward_name = "backward." + spec.name();
  cad_attention_backward_args_v1_t ba = t.backward_args(p);  // O and LSE: the backend's own forward outputs
  status = b.table->backward(b.ctx, &ba);
  b.memory->synchronize();
  if (status != CAD_STATUS_OK) {
    report.fail(backward_name, call_failure(b, status));
    return;
  }
  const BackwardResult grads = oracle_backward(p, d_o);
  const std::vector<double> dq = t.d_q.download(), dk = t.d_k.download(), dv = t.d_v.download();
  const double eq = max_error(dq, grads.d_q, 1e-6, scales.d_q);
  const double ek = max_error(dk, grads.d_k, 1e-6, scales.d_k);
  const double ev = max_error(dv, grads.d_v, 1e-6, scales.d_v);
  const std::string bdetail = format_error("dQ", eq) + ", " + format_error("dK", ek) + ", " + format_error("dV", ev);
  if (eq <= tolerance && ek <= tolerance && ev <= tolerance) {
    report.pass(backward_name, bdetail);
  } else {
    report.fail(backward_name, bdetail);
  }
}

// Windows from 0 (each query sees itself) past the longest document (48 keys), on the layouts whose
// segments carry offsets between queries and keys (KV longer than Q, shared KV), with GQA.
void append_window_cases(const Backend& b, int64_t main_d, std::vector<CaseSpec>& cases) {
  const ElementType type = b.supports(ElementType::F32) ? ElementType::F32 : ElementType::BF16;
  const bool gqa = b.has(CAD_ATTENTION_CAP_GQA);
  const bool shared = b.has(CAD_ATTENTION_CAP_SHARED_KV);
  const auto add = [&](bool causal, int64_t left, int64_t right) {
    for (Layout layout : {Layout::kVarlen, Layout::kKvPrefix, Layout::kSharedKv}) {
      if (layout == Layout::kSharedKv && !shared) continue;
      CaseSpec spec{layout, type, causal, gqa ? 4 : 2, 2, main_d};
      spec.window_left = left;
      spec.window_right = right;
      cases.push_back(spec);
    }
  };
  if (b.has(CAD_ATTENTION_CAP_CAUSAL)) {
    for (int64_t left : {0, 1, 5, 100}) add(true, left, -1);
  }
  if (b.has(CAD_ATTENTION_CAP_NONCAUSAL)) {
    add(false, 3, 2);
    add(false, -1, 0);
    add(false, 0, 7);
  }
}

}  // namespace

int64_t main_head_dim(const Backend& b) {
  if (b.supports_head_dim(64)) return 64;
  for (int64_t d = 16; d <= 512; d += 16) {
    if (b.supports_head_dim(d)) return d;
  }
  return 0;
}

void check_numerics(Backend& b, const Options& options, Report& report) {
  const int64_t main_d = main_head_dim(b);
  if (!report.expect(main_d > 0, "capabilities.head_dim", "head_dim_mask lists no head dim")) return;
  std::vector<CaseSpec> cases;
  for (ElementType type : {ElementType::F32, ElementType::BF16}) {
    if (!b.supports(type)) continue;
    std::vector<bool> modes;
    if (b.has(CAD_ATTENTION_CAP_CAUSAL)) modes.push_back(true);
    if (b.has(CAD_ATTENTION_CAP_NONCAUSAL)) modes.push_back(false);
    for (bool causal : modes) {
      for (Layout layout : {Layout::kVarlen, Layout::kKvPrefix, Layout::kSharedKv, Layout::kSingleTokens,
                            Layout::kEmpty, Layout::kUncoveredOnly}) {
        if (layout == Layout::kSharedKv && !b.has(CAD_ATTENTION_CAP_SHARED_KV)) continue;
        cases.push_back(CaseSpec{layout, type, causal, 2, 2, main_d});
      }
      if (b.has(CAD_ATTENTION_CAP_GQA)) {
        cases.push_back(CaseSpec{Layout::kVarlen, type, causal, 4, 1, main_d});
        if (b.has(CAD_ATTENTION_CAP_SHARED_KV)) cases.push_back(CaseSpec{Layout::kSharedKv, type, causal, 6, 2, main_d});
      }
    }
    // Every head dim the mask lists (quick: the smallest and the largest).
    std::vector<int64_t> dims;
    for (int64_t d = 16; d <= 512; d += 16) {
      if (b.supports_head_dim(d) && d != main_d) dims.push_back(d);
    }
    if (options.quick && dims.size() > 2) dims = {dims.front(), dims.back()};
    const bool causal = b.has(CAD_ATTENTION_CAP_CAUSAL);
    for (int64_t d : dims) cases.push_back(CaseSpec{Layout::kKvPrefix, type, causal, 2, 2, d});
  }
  // Sliding windows, only where declared (a plugin built before ABI v1.2 cannot see the fields; hosts
  // check the flag). Appended last so that the cases above keep their seeds.
  if (b.has(CAD_ATTENTION_CAP_WINDOW)) append_window_cases(b, main_d, cases);
  for (size_t i = 0; i < cases.size(); ++i) {
    // One generator per case, so a case's batch does not depend on which cases ran before it.
    std::seed_seq seed{static_cast<uint32_t>(options.seed), static_cast<uint32_t>(options.seed >> 32),
                       static_cast<uint32_t>(i)};
    std::mt19937_64 rng(seed);
    run_case(b, cases[i], rng, report);
  }
}

}  // namespace cad::conformance
