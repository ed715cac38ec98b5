// minimal_attention.cpp -- the smallest complete attention plugin: what a third party writes to plug
// its own kernel into CAD. CPU, fp32, causal and non-causal, forward and backward, one query head
// per KV head. Read it top to bottom next to plugin_api/cad_attention_v1.h.
//
// The ABI in five rules, and where this file keeps them:
//  1. Export one symbol, cad_plugin_entry_v1, returning a static table (bottom of the file).
//  2. Every instance is an opaque context made by create() and freed by destroy(); no globals.
//  3. No C++ exception may cross the boundary: every entry point runs its body in guarded(), which
//     turns a thrown Failure into a status code plus the message last_error() returns.
//  4. Validate everything before writing anything: on error, outputs stay untouched.
//  5. Declare capabilities honestly, and refuse (UNSUPPORTED) whatever they leave out: hosts and
//     the conformance kit pick backends from them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cad_plugin_v1.h"
#include "plugin_support.h"  // guarded(), create_context(), ConfigReader, check_tensor(), check_segments()

namespace {
using namespace cad::plugin;

constexpr int64_t kMaxHeadDim = 128;

// Rule 2: all state lives here. This backend has no settings, but it still reads its JSON config,
// so that malformed JSON is refused and unknown keys are reported.
struct Context {
  Context(const cad_host_services_v1_t* services, const char* config_json) : logger(services, "example_minimal") {
    ConfigReader(config_json, "plugin 'example_minimal' config").finish(logger);
  }
  ErrorState error;  // holds last_error()
  Logger logger;
};

// Rules 4 and 5: check the call's arguments against what this backend supports; returns Tq, Tk, H, D.
struct Shape { int64_t tq, tk, h, d; };
template <class Args>
Shape check_args(const Args* a) {
  // A v1.0 caller's args are smaller than ours: accept them, and read no field past struct_size.
  const size_t v1_0 = sizeof(Args) == sizeof(cad_attention_forward_args_v1_t) ? CAD_ATTENTION_FORWARD_ARGS_V1_0_SIZE
                                                                              : CAD_ATTENTION_BACKWARD_ARGS_V1_0_SIZE;
  if (a == nullptr || a->struct_size < v1_0) fail(CAD_STATUS_INVALID_ARGUMENT, "args is NULL or too small");
  if (a->stream != nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "stream must be NULL for a CPU backend");
  if (a->num_pieces != 0) fail(CAD_STATUS_UNSUPPORTED, "this backend takes segments, not pieces");
  if (a->q != nullptr && a->q->dtype.code != CAD_DTYPE_CODE_FLOAT) fail(CAD_STATUS_UNSUPPORTED, "tensor 'q': only fp32 is supported");
  check_tensor(a->q, {"q", CAD_DEVICE_CPU, {-1, -1, -1}, {"Tq", "H", "D"}, {DType::F32}});
  check_tensor(a->k, {"k", CAD_DEVICE_CPU, {-1, -1, -1}, {"Tk", "H", "D"}, {DType::F32}});
  const Shape s{a->q->shape[0], a->k->shape[0], a->q->shape[1], a->q->shape[2]};
  if (s.d % 16 != 0 || s.d < 16 || s.d > kMaxHeadDim) {
    fail(CAD_STATUS_UNSUPPORTED, format("tensor 'q': head dim %lld is not one of 16, 32, ..., 128", (long long)s.d));
  }
  if (a->k->shape[1] != s.h) {
    fail(CAD_STATUS_UNSUPPORTED, "tensors 'q' and 'k': grouped-query attention (Hq != Hkv) is not supported");
  }
  check_tensor(a->k, {"k", CAD_DEVICE_CPU, {s.tk, s.h, s.d}, {"Tk", "H", "D"}, {DType::F32}});
  check_tensor(a->v, {"v", CAD_DEVICE_CPU, {s.tk, s.h, s.d}, {"Tk", "H", "D"}, {DType::F32}});
  check_tensor(a->o, {"o", CAD_DEVICE_CPU, {s.tq, s.h, s.d}, {"Tq", "H", "D"}, {DType::F32}});
  check_tensor(a->lse, {"lse", CAD_DEVICE_CPU, {s.h, s.tq}, {"H", "Tq"}, {DType::F32}});
  check_segments(a->segments, a->num_segments, s.tq, s.tk, a->causal != 0);
  return s;
}

float* data(const cad_tensor_v1_t* t) { return static_cast<float*>(tensor_data(t)); }

// The probabilities of query row t (head h) over keys [0, n) of its segment: p_j = exp(s_j - lse).
// Row-major [T, H, D] means element (t, h, e) is at (t * H + h) * D + e.
int64_t probabilities(const cad_segment_v1_t& seg, int64_t i, int64_t h, const Shape& s, const float* q,
                      const float* k, float scale, bool causal, std::vector<float>& p, float* lse) {
  const int64_t n = causal ? i + 1 + seg.kv_len - seg.q_len : seg.kv_len;  // bottom-right aligned mask
  const float* qi = q + ((seg.q_offset + i) * s.h + h) * s.d;
  p.assign(n, 0.0f);
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const float* kj = k + ((seg.kv_offset + j) * s.h + h) * s.d;
    for (int64_t e = 0; e < s.d; ++e) p[j] += qi[e] * kj[e];
    p[j] *= scale;
    max_score = std::max(max_score, p[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(p[j] - max_score);  // subtract the max: no overflow
  *lse = n > 0 ? max_score + std::log(sum) : -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) p[j] = std::exp(p[j] - *lse);
  return n;
}

cad_status_t forward(void* ctx, const cad_attention_forward_args_v1_t* a) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  return guarded(static_cast<Context*>(ctx)->error, [&] {
    const Shape s = check_args(a);
    // Every output element is written: rows no segment covers get O = 0 and LSE = -inf.
    float* o = data(a->o);
    float* lse = data(a->lse);
    std::fill(o, o + s.tq * s.h * s.d, 0.0f);
    std::fill(lse, lse + s.h * s.tq, -std::numeric_limits<float>::infinity());
    std::vector<float> p;
    for (int64_t g = 0; g < a->num_segments; ++g) {
      const cad_segment_v1_t& seg = a->segments[g];
      for (int64_t h = 0; h < s.h; ++h) {
        for (int64_t i = 0; i < seg.q_len; ++i) {
          const int64_t t = seg.q_offset + i;
          const int64_t n = probabilities(seg, i, h, s, data(a->q), data(a->k), a->softmax_scale, a->causal != 0, p,
                                          &lse[h * s.tq + t]);
          for (int64_t j = 0; j < n; ++j) {
            const float* vj = data(a->v) + ((seg.kv_offset + j) * s.h + h) * s.d;
            for (int64_t e = 0; e < s.d; ++e) o[(t * s.h + h) * s.d + e] += p[j] * vj[e];
          }
        }
      }
    }
  });
}

cad_status_t backward(void* ctx, const cad_attention_backward_args_v1_t* a) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  return guarded(static_cast<Context*>(ctx)->error, [&] {
    const Shape s = check_args(a);
    check_tensor(a->d_o, {"d_o", CAD_DEVICE_CPU, {s.tq, s.h, s.d}, {"Tq", "H", "D"}, {DType::F32}});
    check_tensor(a->d_q, {"d_q", CAD_DEVICE_CPU, {s.tq, s.h, s.d}, {"Tq", "H", "D"}, {DType::F32}});
    check_tensor(a->d_k, {"d_k", CAD_DEVICE_CPU, {s.tk, s.h, s.d}, {"Tk", "H", "D"}, {DType::F32}});
    check_tensor(a->d_v, {"d_v", CAD_DEVICE_CPU, {s.tk, s.h, s.d}, {"Tk", "H", "D"}, {DType::F32}});
    float *dq = data(a->d_q), *dk = data(a->d_k), *dv = data(a->d_v);
    std::fill(dq, dq + s.tq * s.h * s.d, 0.0f);
    std::fill(dk, dk + s.tk * s.h * s.d, 0.0f);  // dK/dV sum over every segment that reads a row:
    std::fill(dv, dv + s.tk * s.h * s.d, 0.0f);  // accumulate with += (segments may share KV)
    std::vector<float> p;
    for (int64_t g = 0; g < a->num_segments; ++g) {
      const cad_segment_v1_t& seg = a->segments[g];
      for (int64_t h = 0; h < s.h; ++h) {
        for (int64_t i = 0; i < seg.q_len; ++i) {
          const int64_t row = ((seg.q_offset + i) * s.h + h) * s.d;
          float lse = 0;  // recomputed; equal to the saved LSE for inputs from our own forward
          const int64_t n = probabilities(seg, i, h, s, data(a->q), data(a->k), a->softmax_scale, a->causal != 0, p, &lse);
          float delta = 0;  // D_i = rowsum(dO_i * O_i)
          for (int64_t e = 0; e < s.d; ++e) delta += data(a->d_o)[row + e] * data(a->o)[row + e];
          for (int64_t j = 0; j < n; ++j) {
            const int64_t kv = ((seg.kv_offset + j) * s.h + h) * s.d;
            float dp = 0;  // dP_ij = dO_i . V_j
            for (int64_t e = 0; e < s.d; ++e) dp += data(a->d_o)[row + e] * data(a->v)[kv + e];
            const float ds = p[j] * (dp - delta) * a->softmax_scale;  // through softmax and the scale
            for (int64_t e = 0; e < s.d; ++e) {
              dq[row + e] += ds * data(a->k)[kv + e];
              dk[kv + e] += ds * data(a->q)[row + e];
              dv[kv + e] += p[j] * data(a->d_o)[row + e];
            }
          }
        }
      }
    }
  });
}

cad_status_t get_capabilities(void* ctx, cad_attention_capabilities_v1_t* out) {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  return guarded(static_cast<Context*>(ctx)->error, [&] {
    if (out == nullptr || out->struct_size < sizeof(*out)) fail(CAD_STATUS_INVALID_ARGUMENT, "out is NULL or too small");
    out->device_type = CAD_DEVICE_CPU;
    out->dtype_mask = CAD_ATTENTION_DTYPE_FP32;
    out->flags = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_SHARED_KV |
                 CAD_ATTENTION_CAP_BACKWARD;  // no GQA, no bf16, no pieces: all refused above
    out->head_dim_mask = 0xffu;  // bits 0..7: head dims 16, 32, ..., 128
    out->max_head_dim = static_cast<int32_t>(kMaxHeadDim);
    out->min_compute_capability = 0;
  });
}

cad_status_t create(const cad_host_services_v1_t* services, const char* config, void** out, char* msg, size_t cap) {
  return create_context<Context>(services, config, out, msg, cap);  // checks the services, catches throws
}
void destroy(void* ctx) { delete static_cast<Context*>(ctx); }  // no threads to join
const char* last_error(void* ctx) { return ctx ? static_cast<Context*>(ctx)->error.text() : ""; }

// Rule 1: static tables, valid as long as the library is loaded. get_stats_json is optional: NULL.
const cad_attention_v1_t kTable = {sizeof(cad_attention_v1_t), create, destroy, last_error, get_capabilities,
                                   forward, backward, nullptr,
                                   nullptr, nullptr, nullptr};  // ABI v1.1 plans are optional: not offered
const cad_plugin_v1_t kPlugin = {sizeof(cad_plugin_v1_t), CAD_ABI_VERSION_MAJOR, CAD_ABI_VERSION_MINOR,
                                 CAD_PLUGIN_KIND_ATTENTION, "example_minimal", "1.0.0",
                                 "minimal example attention backend (CPU, fp32, no GQA)", &kTable, nullptr, nullptr};
}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &kPlugin; }
