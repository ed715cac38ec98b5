// split_context.h -- one instance of the "split" communicator: two communicator instances the host created
// before it (config keys `intra` and `inter`, borrowed through services->lookup_plugin as plugin "cad" borrows
// its communicator), a node map (`ranks_per_node`: ranks r and s share a node iff r / ranks_per_node ==
// s / ranks_per_node), and whether an earlier failure left it unusable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "plugin_support.h"
#include "split_stream.h"
#include "split_worker.h"

namespace cad::split_comm {

// A borrowed communicator instance: its table, context, instance name and the config key that named it.
struct Borrowed {
  const cad_communicator_v1_t* table = nullptr;
  void* ctx = nullptr;
  std::string name;
  std::string key;  // "intra" or "inter"
};

class SplitContext {
 public:
  SplitContext(const cad_host_services_v1_t* services, const char* config_json);

  plugin::ErrorState error;
  int32_t rank() const { return rank_; }
  int32_t world_size() const { return world_; }
  cad_device_v1_t device() const { return device_; }

  // all_to_all_v: the pairs inside this rank's node through `intra`, the pairs across nodes through `inter`,
  // both started, then both waited. all_gather and barrier go through `intra` (it spans every rank; they carry
  // the small agreements, not the bytes a slowed link is meant to carry). Throw Failure on error, after which
  // the instance is unusable (the borrowed instances' own state is unknown).
  void all_to_all_v(const void* send, const uint64_t* send_counts, const uint64_t* send_displs, void* recv,
                    const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream);
  void all_gather(const void* send, uint64_t bytes, void* recv, void* stream);
  void barrier(void* stream);

 private:
  [[noreturn]] void broken(cad_status_t status, const std::string& message);
  void check_usable(void* stream, const char* operation) const;  // also refuses a stream on CPU instances
  std::string who() const;  // "plugin 'split' (rank R)" for messages

  plugin::Logger logger_;
  int64_t timeout_ms_ = 60000;
  int32_t ranks_per_node_ = 1;
  Borrowed intra_, inter_;
  int32_t rank_ = 0;
  int32_t world_ = 1;
  cad_device_v1_t device_{CAD_DEVICE_CPU, 0};
  std::string broken_reason_;
  std::unique_ptr<StreamFork> fork_;  // the side stream of stream instances (CUDA)
  std::unique_ptr<Worker> worker_;  // runs the cross-node half on CPU instances (unless "concurrent": false); last: joined first
};

}  // namespace cad::split_comm
