// mpi_requests.h -- nonblocking point-to-point transfers polled against a deadline.
//
// Every collective of the plugin is built from MPI_Isend/MPI_Irecv so that no call can block
// forever: a RequestSet posts the transfers (splitting messages into chunks that fit MPI's int
// counts), polls them with MPI_Testsome until all are done or the deadline passes, and names the
// peers still pending when it gives up. Whatever is still pending when the set goes away is
// cancelled (receives) or released (sends).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include "plugin_support.h"

namespace cad::mpi_comm {

using Clock = std::chrono::steady_clock;

struct Deadline {
  Clock::time_point at;
  int64_t timeout_ms;
  static Deadline after_ms(int64_t ms) { return Deadline{Clock::now() + std::chrono::milliseconds(ms), ms}; }
};

// "MPI_ERR_TRUNCATE: message truncated"-style text for an MPI error code.
std::string mpi_error_text(int code);

class RequestSet {
 public:
  // `operation` names the collective in error messages ("all_to_all_v").
  RequestSet(MPI_Comm comm, std::string operation, uint64_t chunk_bytes);
  ~RequestSet();
  RequestSet(const RequestSet&) = delete;
  RequestSet& operator=(const RequestSet&) = delete;

  // Post `bytes` bytes to / from `peer`, as ceil(bytes / chunk_bytes) messages with the same tag
  // (MPI keeps their order). Zero bytes posts nothing. Throws Failure(COMMUNICATION) if MPI refuses.
  void send(const void* buffer, uint64_t bytes, int peer, int tag);
  void receive(void* buffer, uint64_t bytes, int peer, int tag);

  // Polls until every posted transfer completed. Throws Failure(CAD_STATUS_TIMEOUT) past the
  // deadline, naming `phase` and the peers still pending, or Failure(CAD_STATUS_COMMUNICATION) when
  // MPI reports an error or a message arrives with a size other than the one expected.
  void wait_all(const std::string& phase, const Deadline& deadline);

 private:
  struct Transfer {
    int peer;
    bool is_receive;
    int bytes;  // the size of this chunk, checked on arrival
  };
  void post(void* buffer, uint64_t bytes, int peer, int tag, bool is_receive);
  std::string describe_pending() const;
  void abandon_pending() noexcept;

  MPI_Comm comm_;
  std::string operation_;
  uint64_t chunk_bytes_;
  std::vector<MPI_Request> requests_;
  std::vector<Transfer> transfers_;
};

}  // namespace cad::mpi_comm
