// attention_batches.cpp -- the random varlen batches the attention runner draws, and the tensors of
// one call on the backend's device.
#include <algorithm>
#include <cmath>

#include "attention_internal.h"

namespace cad::conformance {

bool Backend::supports(ElementType type) const {
  return (caps.dtype_mask & (type == ElementType::F32 ? CAD_ATTENTION_DTYPE_FP32 : CAD_ATTENTION_DTYPE_BF16)) != 0;
}

bool Backend::supports_head_dim(int64_t d) const {
  if (d <= 0 || d % 16 != 0 || d > 16 * 32) return false;
  return (caps.head_dim_mask >> (d / 16 - 1)) & 1u;
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kVarlen: return "varlen";
    case Layout::kKvPrefix: return "kv_prefix";
    case Layout::kSharedKv: return "shared_kv";
    case Layout::kSingleTokens: return "single_tokens";
    case Layout::kEmpty: return "empty_batch";
    case Layout::kUncoveredOnly: return "uncovered_only";
  }
  return "?";
}

std::string CaseSpec::name() const {
  std::string text = std::string(layout_name(layout)) + (causal ? ".causal." : ".noncausal.") + element_name(type) +
                     ".h" + std::to_string(hq) + "x" + std::to_string(hkv) + ".d" + std::to_string(d);
  if (window_left >= 0 || window_right >= 0) {
    text += ".window" + std::to_string(window_left) + "x" + std::to_string(window_right);
  }
  return text;
}

std::vector<double> random_values(size_t n, ElementType type, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> values(n);
  for (double& x : values) x = round_to(type, uniform(rng));
  return values;
}

AttentionProblem make_problem(const CaseSpec& spec, std::mt19937_64& rng) {
  AttentionProblem p;
  p.hq = spec.hq;
  p.hkv = spec.hkv;
  p.d = spec.d;
  p.causal = spec.causal;
  p.window_left = spec.window_left;
  p.window_right = spec.window_right;
  p.scale = round_to(ElementType::F32, 1.0 / std::sqrt(static_cast<double>(spec.d)));  // the fp32 the ABI carries
  const auto between = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  int64_t tq = 0, tk = 0;
  const auto add = [&](int64_t q_gap, int64_t q_len, int64_t kv_len) {
    p.segments.push_back(cad_segment_v1_t{tq + q_gap, q_len, tk, kv_len});
    tq += q_gap + q_len;
    tk += kv_len;
  };
  switch (spec.layout) {
    case Layout::kVarlen:
      for (int i = 0; i < 6; ++i) {
        const int64_t len = i == 0 ? 1 : between(1, 40);
        add(between(0, 2), len, len);
        tk += between(0, 2);  // K/V rows no segment reads: their dK/dV must be 0
        if (i == 2) add(0, 0, between(0, 3));
      }
      tq += 1;  // a trailing row no segment covers
      std::shuffle(p.segments.begin(), p.segments.end(), rng);
      break;
    case Layout::kKvPrefix:
      for (int i = 0; i < 5; ++i) {
        const int64_t q_len = between(1, 16);
        add(0, q_len, q_len + between(1, 40));
      }
      if (!spec.causal) add(0, 5, 3);  // non-causal allows q_len > kv_len
      break;
    case Layout::kSharedKv:
      for (int doc = 0; doc < 3; ++doc) {
        // One document's KV stored once; its queries cut into head, middle and tail tasks placed tail first.
        const int64_t len = between(8, 48);
        const int64_t cut1 = between(1, len / 2), cut2 = between(len / 2 + 1, len - 1);
        const int64_t bounds[4] = {0, cut1, cut2, len};
        for (int t = 2; t >= 0; --t) {
          const int64_t q_begin = bounds[t], q_end = bounds[t + 1];
          p.segments.push_back(cad_segment_v1_t{tq, q_end - q_begin, tk, spec.causal ? q_end : len});
          tq += q_end - q_begin;
        }
        tk += len;
      }
      break;
    case Layout::kSingleTokens:
      for (int i = 0; i < 8; ++i) add(0, 1, i % 2 == 0 ? 1 : between(2, 30));
      break;
    case Layout::kEmpty:
      break;
    case Layout::kUncoveredOnly:
      tq = 5;
      tk = 7;
      break;
  }
  p.tq = tq;
  p.tk = tk;
  p.q = random_values(static_cast<size_t>(tq * p.hq * p.d), spec.type, rng);
  p.k = random_values(static_cast<size_t>(tk * p.hkv * p.d), spec.type, rng);
  p.v = random_values(static_cast<size_t>(tk * p.hkv * p.d), spec.type, rng);
  return p;
}

CallTensors::CallTensors(Memory& memory, const AttentionProblem& p, ElementType type, const std::vector<double>& d_o_values)
    : q(memory, type, {p.tq, p.hq, p.d}),
      k(memory, type, {p.tk, p.hkv, p.d}),
      v(memory, type, {p.tk, p.hkv, p.d}),
      o(memory, type, {p.tq, p.hq, p.d}),
      lse(memory, ElementType::F32, {p.hq, p.tq}),
      d_o(memory, type, {p.tq, p.hq, p.d}),
      d_q(memory, type, {p.tq, p.hq, p.d}),
      d_k(memory, type, {p.tk, p.hkv, p.d}),
      d_v(memory, type, {p.tk, p.hkv, p.d}) {
  q.upload(p.q);
  k.upload(p.k);
  v.upload(p.v);
  d_o.upload(d_o_values);
  fill_outputs_with_sentinel();
}

void CallTensors::fill_outputs_with_sentinel() {
  for (Tensor* t : {&o, &lse, &d_q, &d_k, &d_v}) t->fill_sentinel();
}

bool CallTensors::forward_outputs_untouched() const { return o.holds_sentinel() && lse.holds_sentinel(); }

bool CallTensors::backward_outputs_untouched() const {
  return d_q.holds_sentinel() && d_k.holds_sentinel() && d_v.holds_sentinel();
}

cad_attention_forward_args_v1_t CallTensors::forward_args(const AttentionProblem& p) {
  cad_attention_forward_args_v1_t a{};
  a.struct_size = sizeof(a);
  a.segments = p.segments.empty() ? nullptr : p.segments.data();
  a.num_segments = static_cast<int64_t>(p.segments.size());
  a.softmax_scale = static_cast<float>(p.scale);
  a.causal = p.causal ? 1 : 0;
  a.window_flags = CAD_WINDOW_GIVEN;  // -1 = no limit: the case's window, if any
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.q = q.desc();
  a.k = k.desc();
  a.v = v.desc();
  a.o = o.desc();
  a.lse = lse.desc();
  return a;
}

cad_attention_backward_args_v1_t CallTensors::backward_args(const AttentionProblem& p) {
  cad_attention_backward_args_v1_t a{};
  a.struct_size = sizeof(a);
  a.segments = p.segments.empty() ? nullptr : p.segments.data();
  a.num_segments = static_cast<int64_t>(p.segments.size());
  a.softmax_scale = static_cast<float>(p.scale);
  a.causal = p.causal ? 1 : 0;
  a.window_flags = CAD_WINDOW_GIVEN;
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.q = q.desc();
  a.k = k.desc();
  a.v = v.desc();
  a.o = o.desc();
  a.lse = lse.desc();
  a.d_o = d_o.desc();
  a.d_q = d_q.desc();
  a.d_k = d_k.desc();
  a.d_v = d_v.desc();
  return a;
}

}  // namespace cad::conformance
