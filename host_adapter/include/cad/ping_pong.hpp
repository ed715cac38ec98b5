// ping_pong.hpp -- DESIGN.md step 6 for C++ hosts: a micro-batch split into two nano-batches, each with
// its own CAD plan, whose layers are enqueued so that one nano-batch's attention traffic is in flight
// while the other's compute runs.
//
// CAD's forward and backward only enqueue work: packs and the server batch on the caller's stream, the
// all_to_all_v on the CAD instance's communication stream (joined with events). With the two nano-batches
// on two compute streams, the GPU runs A's exchanges under B's compute and the other way round; what the
// host must get right is the ORDER in which it enqueues, because every rank must issue its collectives in
// the same order (NCCL requires it) and each nano-batch's attention must be enqueued before the other's
// compute that should hide it. This helper fixes that order:
//   per layer:  A.before  A.attention  B.before  B.attention  A.after  B.after
// Every callback only enqueues on the stream it is given (a cudaStream_t as void*). No CUDA dependency here.
#pragma once

#include <functional>
#include <stdexcept>

namespace cad {

struct NanoBatchCallbacks {
  // Enqueue nano-batch `nano` (0 = A, 1 = B), layer `layer`, on `stream`.
  std::function<void(int nano, int layer, void* stream)> before_attention;  // e.g. norm + QKV projection
  std::function<void(int nano, int layer, void* stream)> attention;         // CAD forward with that nano-batch's plan
  std::function<void(int nano, int layer, void* stream)> after_attention;   // e.g. output projection + MLP
};

// Forward of `layers` layers of two nano-batches on `stream_a` / `stream_b`. Backward is the same schedule
// in reverse layer order with the callbacks doing the backward work (autograd-style hosts pass the
// backward pieces as the same three callbacks).
inline void run_ping_pong(int layers, const NanoBatchCallbacks& cb, void* stream_a, void* stream_b, bool reverse = false) {
  if (!cb.before_attention || !cb.attention || !cb.after_attention) {
    throw std::invalid_argument("run_ping_pong: every callback must be set");
  }
  if (layers < 0) throw std::invalid_argument("run_ping_pong: layers must be >= 0");
  void* const streams[2] = {stream_a, stream_b};
  for (int i = 0; i < layers; ++i) {
    const int layer = reverse ? layers - 1 - i : i;
    for (int nano = 0; nano < 2; ++nano) {
      cb.before_attention(nano, layer, streams[nano]);
      cb.attention(nano, layer, streams[nano]);
    }
    for (int nano = 0; nano < 2; ++nano) cb.after_attention(nano, layer, streams[nano]);
  }
}

}  // namespace cad
