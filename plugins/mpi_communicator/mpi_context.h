// mpi_context.h -- one instance of the "mpi" communicator: its config, its own MPI communicator and
// the state the ABI requires (last error; whether an earlier failure left it unusable).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include "plugin_support.h"

namespace cad::mpi_comm {

struct MpiConfig {
  int64_t timeout_ms = 60000;        // deadline of every collective (and of create's MPI_Comm_idup)
  uint64_t chunk_bytes = 1ull << 30; // largest single MPI message; larger transfers are split
  bool verify_counts = true;         // all_to_all_v exchanges byte counts first and refuses mismatches
  // Sub-communicator: either split (color, key) or an explicit list of world ranks, or neither.
  bool use_split = false;
  int split_color = 0;
  int split_key = 0;
  bool split_key_given = false;  // otherwise the world rank is the key (keeps the world's order)
  std::vector<int> ranks;  // empty = not used
};

// Reads and validates the plugin's JSON config; errors name the key.
MpiConfig read_config(const char* config_json, const plugin::Logger& logger);

class MpiContext {
 public:
  MpiContext(const cad_host_services_v1_t* services, const char* config_json);
  ~MpiContext();
  MpiContext(const MpiContext&) = delete;
  MpiContext& operator=(const MpiContext&) = delete;

  plugin::ErrorState error;
  const plugin::Logger& logger() const { return logger_; }
  const MpiConfig& config() const { return config_; }
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // A fresh tag base for the next collective, so that messages of an abandoned call never match a
  // later one. Each collective may use tags base .. base + kTagsPerCall - 1.
  static constexpr int kTagsPerCall = 4;
  int next_tag_base();

  // Throws Failure(COMMUNICATION) if an earlier timeout or MPI error left the instance unusable.
  void check_usable() const;
  // Records that the instance is unusable (the in-flight state of the group is unknown).
  // After a timeout or MPI error: the instance refuses further calls, and the reason is logged at
  // once (with this rank), before the host unwinds and tears down -- so that it is seen even if the
  // teardown of a job with a stalled peer never finishes.
  void mark_broken(const std::string& reason);

 private:
  void create_communicator();

  plugin::Logger logger_;
  MpiConfig config_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  int tag_limit_ = 32767;
  uint64_t calls_ = 0;
  std::string broken_reason_;
};

}  // namespace cad::mpi_comm
