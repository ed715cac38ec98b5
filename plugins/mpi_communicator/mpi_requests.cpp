// mpi_requests.cpp -- see mpi_requests.h.
#include "mpi_requests.h"

#include <algorithm>
#include <set>
#include <thread>

namespace cad::mpi_comm {

using plugin::fail;
using plugin::format;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return format("MPI error %d", code);
  return std::string(text, static_cast<size_t>(length));
}

RequestSet::RequestSet(MPI_Comm comm, std::string operation, uint64_t chunk_bytes)
    : comm_(comm), operation_(std::move(operation)), chunk_bytes_(chunk_bytes) {}

RequestSet::~RequestSet() { abandon_pending(); }

void RequestSet::send(const void* buffer, uint64_t bytes, int peer, int tag) {
  // MPI_Isend takes a non-const buffer only in old MPI headers; it never writes to it.
  post(const_cast<void*>(buffer), bytes, peer, tag, false);
}

void RequestSet::receive(void* buffer, uint64_t bytes, int peer, int tag) { post(buffer, bytes, peer, tag, true); }

void RequestSet::post(void* buffer, uint64_t bytes, int peer, int tag, bool is_receive) {
  char* cursor = static_cast<char*>(buffer);
  for (uint64_t done = 0; done < bytes;) {
    const int chunk = static_cast<int>(std::min<uint64_t>(chunk_bytes_, bytes - done));
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = is_receive ? MPI_Irecv(cursor + done, chunk, MPI_BYTE, peer, tag, comm_, &request)
                              : MPI_Isend(cursor + done, chunk, MPI_BYTE, peer, tag, comm_, &request);
    if (rc != MPI_SUCCESS) {
      fail(CAD_STATUS_COMMUNICATION, format("%s: %s %d bytes %s rank %d failed: %s", operation_.c_str(),
                                            is_receive ? "MPI_Irecv of" : "MPI_Isend of", chunk,
                                            is_receive ? "from" : "to", peer, mpi_error_text(rc).c_str()));
    }
    requests_.push_back(request);
    transfers_.push_back(Transfer{peer, is_receive, chunk});
    done += static_cast<uint64_t>(chunk);
  }
}

static std::string rank_list(const std::set<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

std::string RequestSet::describe_pending() const {
  std::set<int> receive_from, send_to;
  for (size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i] == MPI_REQUEST_NULL) continue;
    (transfers_[i].is_receive ? receive_from : send_to).insert(transfers_[i].peer);
  }
  std::set<int> peers = receive_from;
  peers.insert(send_to.begin(), send_to.end());
  std::string out = "peer rank(s) not yet completed: " + rank_list(peers) + " (";
  if (!receive_from.empty()) out += "receiving from " + rank_list(receive_from);
  if (!send_to.empty()) out += std::string(receive_from.empty() ? "" : "; ") + "sending to " + rank_list(send_to);
  return out + ")";
}

void RequestSet::wait_all(const std::string& phase, const Deadline& deadline) {
  const int count = static_cast<int>(requests_.size());
  std::vector<int> indices(requests_.size());
  std::vector<MPI_Status> statuses(requests_.size());
  int remaining = static_cast<int>(std::count_if(requests_.begin(), requests_.end(),
                                                 [](MPI_Request r) { return r != MPI_REQUEST_NULL; }));
  int idle_polls = 0;
  while (remaining > 0) {
    int completed = 0;
    const int rc = MPI_Testsome(count, requests_.data(), &completed, indices.data(), statuses.data());
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
      fail(CAD_STATUS_COMMUNICATION,
           format("%s (%s): MPI_Testsome failed: %s", operation_.c_str(), phase.c_str(), mpi_error_text(rc).c_str()));
    }
    if (completed == MPI_UNDEFINED) completed = 0;
    for (int k = 0; k < completed; ++k) {
      const Transfer& t = transfers_[static_cast<size_t>(indices[static_cast<size_t>(k)])];
      const MPI_Status& status = statuses[static_cast<size_t>(k)];
      if (rc == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS) {
        fail(CAD_STATUS_COMMUNICATION, format("%s (%s): %s rank %d failed: %s", operation_.c_str(), phase.c_str(),
                                              t.is_receive ? "receiving from" : "sending to", t.peer,
                                              mpi_error_text(status.MPI_ERROR).c_str()));
      }
      if (t.is_receive) {
        int received = -1;
        MPI_Get_count(&status, MPI_BYTE, &received);
        if (received != t.bytes) {
          fail(CAD_STATUS_COMMUNICATION,
               format("%s (%s): rank %d sent a message of %d bytes where %d bytes were expected (the ranks "
                      "disagree on the sizes)",
                      operation_.c_str(), phase.c_str(), t.peer, received, t.bytes));
        }
      }
    }
    remaining -= completed;
    if (remaining == 0) break;
    if (completed > 0) {
      idle_polls = 0;
      continue;
    }
    if (Clock::now() >= deadline.at) {
      fail(CAD_STATUS_TIMEOUT, format("%s (%s): timed out after %lld ms; %s", operation_.c_str(), phase.c_str(),
                                      static_cast<long long>(deadline.timeout_ms), describe_pending().c_str()));
    }
    // Let other processes of an oversubscribed node run; back off to short sleeps when idle long.
    if (++idle_polls < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void RequestSet::abandon_pending() noexcept {
  // Receives that never matched are cancelled so that no late message lands in the caller's buffer
  // after the call returned; sends are released (MPI completes or drops them on its own).
  const auto grace = Clock::now() + std::chrono::milliseconds(100);
  for (size_t i = 0; i < requests_.size(); ++i) {
    MPI_Request& request = requests_[i];
    if (request == MPI_REQUEST_NULL) continue;
    if (transfers_[i].is_receive) {
      MPI_Cancel(&request);
      int done = 0;
      while (!done && Clock::now() < grace) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::yield();
      }
      if (done) continue;
    }
    MPI_Request_free(&request);
  }
}

}  // namespace cad::mpi_comm
