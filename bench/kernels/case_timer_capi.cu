// case_timer_capi.cu -- case_timer.h behind a C entry point, built as a shared library
// (libcad_kernel_timer.so, by run_diet.sh or CMake) that bench/kernels/diet_bench.py loads with ctypes, so
// that our kernels and cuDNN (through torch) are timed in one process, on one GPU context, in the same
// round. No C++ exception crosses: every failure is a status and a message.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "case_timer.h"

#define CAD_TIMER_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// Status codes of the entry points (diet_bench.py mirrors them).
constexpr int kOk = 0;
constexpr int kInvalidArgument = 1;  // the case itself is wrong; nothing ran
constexpr int kNoMemory = 2;         // the case does not fit in the free device memory; nothing ran
constexpr int kCudaError = 3;        // a CUDA call failed: the context may be unusable from now on

void set_error(char* error, size_t capacity, const std::string& message) {
  if (error == nullptr || capacity == 0) return;
  std::snprintf(error, capacity, "%s", message.c_str());
}

// Runs an entry point's body; any exception becomes a status and a message (none crosses the C ABI).
template <class Body>
int guarded(char* error, size_t capacity, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    set_error(error, capacity, "out of host memory");
    return kNoMemory;
  } catch (const std::exception& ex) {
    set_error(error, capacity, ex.what());
    return kCudaError;
  } catch (...) {
    set_error(error, capacity, "unknown exception");
    return kCudaError;
  }
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() {
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      throw std::runtime_error("cudaStreamCreateWithFlags failed");
    }
  }
  ~Stream() { cudaStreamDestroy(s); }
};

}  // namespace

// The contract version of these entry points: the driver refuses a library of another version.
CAD_TIMER_EXPORT int cad_kernel_timer_version(void) { return 1; }

// Device 0 as the kernels see it: name, SM count, whether the Hopper (wgmma) kernels run.
CAD_TIMER_EXPORT int cad_kernel_timer_device(char* name, size_t name_capacity, int* num_sms, int* hopper, char* error,
                                             size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    cudaDeviceProp prop{};
    const cudaError_t e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
      set_error(error, error_capacity, std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(e));
      return kCudaError;
    }
    set_error(name, name_capacity, prop.name);
    if (num_sms != nullptr) *num_sms = prop.multiProcessorCount;
    if (hopper != nullptr) *hopper = cad::kernels::hopper_kernels_available() ? 1 : 0;
    return kOk;
  });
}

// Times one case: `segments` holds num_segments x 4 int64 (q_offset, q_len, kv_offset, kv_len), rows of a
// batch of tq query rows and tk key/value rows; `warmups` calls, then the median of `reps`. Writes
// out_ms[0] = forward, out_ms[1] = backward (0 when `backward` is 0). Returns kOk, or a status with a
// message in `error`.
CAD_TIMER_EXPORT int cad_kernel_time_case(const int64_t* segments, int64_t num_segments, int64_t tq, int64_t tk,
                                          int causal, int head_dim, int hq, int hkv, int warmups, int reps,
                                          int backward, double* out_ms, char* error, size_t error_capacity) {
  return guarded(error, error_capacity, [&] {
    if (out_ms == nullptr || num_segments < 0 || (num_segments > 0 && segments == nullptr)) {
      set_error(error, error_capacity, "out_ms is NULL, or num_segments < 0, or segments is NULL");
      return kInvalidArgument;
    }
    static_assert(sizeof(cad::kernels::Segment) == 4 * sizeof(int64_t), "Segment is four int64");
    cad::bench::TimedCase c;
    c.segments.resize(static_cast<size_t>(num_segments));
    if (num_segments > 0) std::memcpy(c.segments.data(), segments, c.segments.size() * sizeof(cad::kernels::Segment));
    c.tq = tq;
    c.tk = tk;
    c.causal = causal != 0;
    c.head_dim = head_dim;
    c.hq = hq;
    c.hkv = hkv;
    cad::bench::TimingOptions o;
    o.warmups = warmups;
    o.reps = reps;
    o.backward = backward != 0;
    int num_sms = 0;
    if (cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
      set_error(error, error_capacity, "cudaDeviceGetAttribute(multiProcessorCount) failed");
      return kCudaError;
    }
    const Stream stream;
    try {
      const cad::bench::CaseTiming t = cad::bench::time_case(c, o, num_sms, stream.s);
      out_ms[0] = t.fwd_ms;
      out_ms[1] = t.bwd_ms;
      return kOk;
    } catch (const std::invalid_argument& ex) {
      set_error(error, error_capacity, ex.what());
      return kInvalidArgument;
    } catch (const cad::bench::NotEnoughMemory& ex) {
      set_error(error, error_capacity, ex.what());
      return kNoMemory;
    }
  });
}
