// comm.h -- the communicator instance CAD borrows from the host, as a small C++ wrapper whose calls
// throw plugin::Failure (naming the instance and the operation) instead of returning a status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cad_communicator_v1.h"
#include "exchange.h"

namespace cad::cad_plugin {

class Comm {
 public:
  Comm(const cad_communicator_v1_t* table, void* instance, std::string name);

  int32_t rank() const { return rank_; }
  int32_t world() const { return world_; }
  const std::string& name() const { return name_; }
  cad_device_v1_t device() const;

  // Every rank contributes `bytes` bytes; recv gets world * bytes, by rank.
  void all_gather(const void* send, uint64_t bytes, void* recv);
  // `stream`: NULL for a CPU communicator; the stream to enqueue on for a device one.
  void all_to_all_v(const std::byte* send, const Transfer& transfer, std::byte* recv, void* stream = nullptr);

  // All ranks' copies of a trivially copyable value, by rank.
  template <class T>
  std::vector<T> all_gather_value(const T& value) {
    std::vector<T> all(static_cast<size_t>(world_));
    all_gather(&value, sizeof(T), all.data());
    return all;
  }

 private:
  [[noreturn]] void failed(const char* operation, cad_status_t status) const;

  const cad_communicator_v1_t* table_;
  void* instance_;
  std::string name_;
  int32_t rank_ = 0;
  int32_t world_ = 1;
};

// Collective agreement on an outcome. Every rank passes its own status and message; if any rank
// failed, EVERY rank throws the failure of the lowest failing rank, with the same status and the
// message "<what> on rank R: <its message>". Costs one small all_gather.
void agree(Comm& comm, cad_status_t status, const std::string& message, const char* what);

}  // namespace cad::cad_plugin
