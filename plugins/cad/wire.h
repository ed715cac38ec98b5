// wire.h -- the collective of one exchange once its rows are packed: how a Transfer's bytes cross between the
// ranks. One interface, one implementation per data path:
//   HostWire    CPU buffers, a communicator on host memory (mpi, host): the all_to_all_v itself, returning when the
//               bytes are there (the CPU path's exchange(), data_path.cpp).
//   DeviceWire  device buffers, a communicator on device memory (nccl): enqueued on the instance's communication
//               stream after the caller's work so far, joined back to the caller's stream with events, timed
//               (wire_device.cpp).
//   StagedWire  device buffers, a communicator on host memory: through the plan's pinned host buffers, which
//               synchronises the caller's stream (wire_device.cpp; DESIGN.md: "CAD stages steps 3-5 through pinned
//               host buffers").
// Packing rows into the send buffer and unpacking them from the receive buffer is the caller's: exchange.cpp on the
// CPU, the Mover (mover.h) on CUDA.
#pragma once

#include <cstddef>

#include "comm.h"
#include "exchange.h"

namespace cad::cad_plugin {

struct ExchangeEvents;  // gpu_timing.h

// What join() needs of one move (DeviceWire only; empty on the host wires).
struct WireTicket {
  void* done = nullptr;              // a cudaEvent_t: the collective's end on the communication stream
  ExchangeEvents* timing = nullptr;  // its timing events until joined (in the runtime's queue), or NULL (untimed)
};

class Wire {
 public:
  virtual ~Wire() = default;
  // Moves `t`'s bytes from `send` to the peers and theirs into `recv`. A host wire returns once they are there;
  // a device wire only enqueues, and join() makes the caller wait for them. `timed`: time it, where the wire times
  // (DeviceWire; a drained call is not timed).
  virtual void move(const std::byte* send, const Transfer& t, std::byte* recv, bool timed, WireTicket& ticket) = 0;
  // The caller's stream waits for the move behind `ticket` (the host wires moved the bytes already).
  virtual void join(WireTicket& ticket) { (void)ticket; }
};

class HostWire final : public Wire {
 public:
  explicit HostWire(Comm& comm) : comm_(comm) {}
  void move(const std::byte* send, const Transfer& t, std::byte* recv, bool, WireTicket&) override {
    comm_.all_to_all_v(send, t, recv);
  }

 private:
  Comm& comm_;
};

}  // namespace cad::cad_plugin
