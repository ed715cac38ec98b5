// host_context.h -- one instance of the "host" communicator: the host's lent collectives (services
// ->host_all_to_all_v / host_all_gather / host_barrier, ABI v1.1), its config, and whether an earlier
// failure left it unusable.
#pragma once

#include <cstdint>
#include <string>

#include "plugin_support.h"

namespace cad::host_comm {

struct HostCommConfig {
  int64_t timeout_ms = 60000;  // passed to every lent collective as its deadline
  bool verify_counts = true;   // all_to_all_v / all_gather first agree on byte counts, refused on every rank
};

class HostCommContext {
 public:
  HostCommContext(const cad_host_services_v1_t* services, const char* config_json);

  plugin::ErrorState error;
  int32_t rank() const { return rank_; }
  int32_t world_size() const { return world_; }

  // The collectives (CPU memory; every rank makes the same calls). Throw Failure on error; after a
  // timeout or a failure of the host's collective the instance is unusable (the group's state is unknown).
  void all_to_all_v(const void* send, const uint64_t* send_counts, const uint64_t* send_displs, void* recv,
                    const uint64_t* recv_counts, const uint64_t* recv_displs);
  void all_gather(const void* send, uint64_t bytes, void* recv);
  void barrier();

 private:
  // Calls one lent collective; on failure marks the instance broken and throws with the host's message.
  template <class Call>
  void call_host(const char* operation, Call&& call);
  void check_usable() const;

  const cad_host_services_v1_t* services_;
  plugin::Logger logger_;
  HostCommConfig config_;
  int32_t rank_ = 0;
  int32_t world_ = 1;
  std::string broken_reason_;
};

}  // namespace cad::host_comm
