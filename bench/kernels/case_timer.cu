// case_timer.cu -- see case_timer.h.
#include "case_timer.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace cad::bench {
namespace {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(e));
}

// Device memory that is freed however the timing ends.
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer(size_t bytes, const char* name) {
    const cudaError_t e = cudaMalloc(&ptr, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; leave no error behind for the caller
      throw std::runtime_error(std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes (" + name +
                               "): " + cudaGetErrorString(e));
    }
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
};

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    check(cudaEventCreate(&a), "cudaEventCreate");
    if (cudaEventCreate(&b) != cudaSuccess) {
      cudaEventDestroy(a);
      throw std::runtime_error("cudaEventCreate failed");
    }
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    p[i] = __float2bfloat16(static_cast<float>(x) / 4294967296.f * 2.f - 1.f);
  }
}

// Median over `reps` calls of `run`, after `warmups` calls; `run` throws on a failed launch.
template <class F>
double median_ms(F&& run, int warmups, int reps, cudaStream_t stream) {
  for (int i = 0; i < warmups; ++i) run();
  check(cudaStreamSynchronize(stream), "warm-up");
  Events ev;
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(ev.a, stream), "cudaEventRecord");
    run();
    check(cudaEventRecord(ev.b, stream), "cudaEventRecord");
    check(cudaEventSynchronize(ev.b), "timed call");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev.a, ev.b), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// What the kernels assume of a case; the plans do not check it.
void validate(const TimedCase& c, const TimingOptions& o) {
  if (!cad::kernels::head_dim_supported(c.head_dim)) {
    throw std::invalid_argument("head dim " + std::to_string(c.head_dim) + " is not supported (64 or 128)");
  }
  if (c.hq < 1 || c.hkv < 1 || c.hq % c.hkv != 0) {
    throw std::invalid_argument("heads: expected Hq % Hkv == 0 and both >= 1, got Hq " + std::to_string(c.hq) +
                                ", Hkv " + std::to_string(c.hkv));
  }
  if (c.tq < 1 || c.tk < 1 || o.reps < 1 || o.warmups < 0) {
    throw std::invalid_argument("expected tq, tk, reps >= 1 and warmups >= 0");
  }
  for (size_t i = 0; i < c.segments.size(); ++i) {
    const cad::kernels::Segment& s = c.segments[i];
    if (s.q_offset < 0 || s.q_len < 0 || s.kv_offset < 0 || s.kv_len < 0 || s.q_len > c.tq - s.q_offset ||
        s.kv_len > c.tk - s.kv_offset) {
      throw std::invalid_argument("segment " + std::to_string(i) + " (" + std::to_string(s.q_offset) + ", " +
                                  std::to_string(s.q_len) + ", " + std::to_string(s.kv_offset) + ", " +
                                  std::to_string(s.kv_len) + ") is outside the batch's " + std::to_string(c.tq) +
                                  " x " + std::to_string(c.tk) + " rows");
    }
  }
}

cad::kernels::AttentionProblem problem_of(const TimedCase& c, bool hopper) {
  cad::kernels::AttentionProblem pr;
  pr.tq = c.tq;
  pr.tk = c.tk;
  pr.hq = c.hq;
  pr.hkv = c.hkv;
  pr.head_dim = c.head_dim;
  pr.softmax_scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  pr.causal = c.causal;
  pr.window_left = c.window_left;
  pr.hopper = hopper;
  return pr;
}

// The plans a timing runs: the default kernels', and the portable ones' when asked for.
struct Plans {
  cad::kernels::ForwardPlan fwd, portable_fwd;
  cad::kernels::BackwardPlan bwd, portable_bwd;
  size_t workspace = 0;

  Plans(const TimedCase& c, const TimingOptions& o, int num_sms) {
    const int sms = o.split_kv ? std::max(num_sms, 1) : 1;
    const auto* seg = c.segments.data();
    const auto n = static_cast<int64_t>(c.segments.size());
    const auto pr = problem_of(c, cad::kernels::hopper_kernels_available());
    fwd = cad::kernels::make_forward_plan(pr, seg, n, sms);
#ifdef CAD_TIMER_DYNAMIC_WALK  // build_timer.sh with CAD_TIMER_DEFINES=-DCAD_TIMER_DYNAMIC_WALK: an A/B of the walks
    fwd.dynamic_walk = true;
#endif
    bwd = cad::kernels::make_backward_plan(pr, seg, n);  // also when not timed: it reports kv_exclusive
    workspace = std::max(fwd.workspace_bytes, o.backward ? bwd.workspace_bytes : 0);
    if (o.portable) {
      const auto pp = problem_of(c, false);
      portable_fwd = cad::kernels::make_forward_plan(pp, seg, n, sms);
      workspace = std::max(workspace, portable_fwd.workspace_bytes);
      if (o.backward) {
        portable_bwd = cad::kernels::make_backward_plan(pp, seg, n);
        workspace = std::max(workspace, portable_bwd.workspace_bytes);
      }
    }
  }
};

size_t tensor_bytes(const TimedCase& c) {
  const size_t nq = size_t(c.tq) * c.hq * c.head_dim, nk = size_t(c.tk) * c.hkv * c.head_dim;
  return 4 * nq * 2 + 4 * nk * 2 + size_t(c.tq) * c.hq * 4;  // Q O dO dQ, K V dK dV (bf16), LSE (fp32)
}

}  // namespace

double forward_flops(const TimedCase& c) {
  double total = 0;
  for (const cad::kernels::Segment& s : c.segments) {
    const double q = static_cast<double>(s.q_len), kv = static_cast<double>(s.kv_len);
    if (c.causal && c.window_left >= 0) {
      // Query at key position p (bottom-right: p = i + kv - q) sees keys max(0, p - left) .. p: min(p, left) + 1.
      const double w = c.window_left, a = std::max(kv - q, 0.0), b = kv - 1;
      const double last_ramp = std::min(b, w);  // p <= left: p + 1 keys
      double pairs = last_ramp >= a ? (last_ramp - a + 1) * (a + last_ramp + 2) / 2 : 0;
      const double flat_from = std::max(a, w + 1);  // p > left: left + 1 keys
      if (b >= flat_from) pairs += (b - flat_from + 1) * (w + 1);
      total += 4.0 * c.head_dim * pairs;
      continue;
    }
    total += c.causal ? 4.0 * c.head_dim * (q * kv - q * (q - 1) / 2) : 4.0 * c.head_dim * q * kv;
  }
  return total * c.hq;
}

CaseTiming time_case(const TimedCase& c, const TimingOptions& o, int num_sms, cudaStream_t stream) {
  validate(c, o);
  const Plans plans(c, o, num_sms);
  // Refuse what cannot fit before allocating, leaving a margin for the allocator's granularity.
  const size_t needed = tensor_bytes(c) + plans.workspace;
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (needed + (size_t{256} << 20) > free_bytes) {
    throw NotEnoughMemory("needs " + std::to_string(needed >> 20) + " MiB of device memory, " +
                          std::to_string(free_bytes >> 20) + " MiB free");
  }
  const size_t nq = size_t(c.tq) * c.hq * c.head_dim, nk = size_t(c.tk) * c.hkv * c.head_dim;
  const DeviceBuffer q(nq * 2, "q"), o_(nq * 2, "o"), d_o(nq * 2, "dO"), dq(nq * 2, "dQ");
  const DeviceBuffer k(nk * 2, "k"), v(nk * 2, "v"), dk(nk * 2, "dK"), dv(nk * 2, "dV");
  const DeviceBuffer lse(size_t(c.tq) * c.hq * 4, "lse"), ws(plans.workspace, "workspace");
  fill_random<<<1024, 256, 0, stream>>>(q.as<__nv_bfloat16>(), nq, 1);
  fill_random<<<1024, 256, 0, stream>>>(k.as<__nv_bfloat16>(), nk, 2);
  fill_random<<<1024, 256, 0, stream>>>(v.as<__nv_bfloat16>(), nk, 3);
  fill_random<<<1024, 256, 0, stream>>>(d_o.as<__nv_bfloat16>(), nq, 4);
  check(cudaGetLastError(), "fill_random");

  auto forward = [&](const cad::kernels::ForwardPlan& plan) {
    check(cad::kernels::attention_forward(plan, q.ptr, k.ptr, v.ptr, o_.ptr, lse.as<float>(), ws.ptr, stream),
          "attention_forward");
  };
  auto backward = [&](const cad::kernels::BackwardPlan& plan) {
    check(cad::kernels::attention_backward(plan, q.ptr, k.ptr, v.ptr, o_.ptr, lse.as<float>(), d_o.ptr, dq.ptr,
                                           dk.ptr, dv.ptr, ws.ptr, stream),
          "attention_backward");
  };
  CaseTiming t;
  t.fwd_items = plans.fwd.items.size();
  t.fwd_combines = plans.fwd.combines.size();
  t.bwd_kv_exclusive = plans.bwd.kv_exclusive;
  t.fwd_ms = median_ms([&] { forward(plans.fwd); }, o.warmups, o.reps, stream);
  if (o.portable) {
    t.portable_fwd_ms = median_ms([&] { forward(plans.portable_fwd); }, o.warmups, o.reps, stream);
    forward(plans.fwd);  // the backward reads the default forward's O/LSE
  }
  if (o.backward) {
    t.bwd_ms = median_ms([&] { backward(plans.bwd); }, o.warmups, o.reps, stream);
    if (o.portable) t.portable_bwd_ms = median_ms([&] { backward(plans.portable_bwd); }, o.warmups, o.reps, stream);
  }
  check(cudaStreamSynchronize(stream), "synchronize");
  return t;
}

}  // namespace cad::bench
