// nccl_context.h -- one instance of the "nccl" communicator: config, device, bootstrap result, the
// guarded NCCL communicator and a small device buffer for barriers.
#pragma once

#include <memory>

#include "nccl_bootstrap.h"
#include "nccl_config.h"
#include "nccl_copy_engine.h"
#include "nccl_guarded_comm.h"

namespace cad::nccl_comm {

class NcclContext {
 public:
  NcclContext(const cad_host_services_v1_t* services, const char* config_json);
  ~NcclContext();
  NcclContext(const NcclContext&) = delete;
  NcclContext& operator=(const NcclContext&) = delete;

  plugin::ErrorState error;
  const NcclConfig& config() const { return config_; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  GuardedComm& comm() { return *comm_; }
  int32_t* barrier_word() const { return barrier_word_; }
  // Device memory for verify_counts: (world + 1) rows of 2 * world words (NULL unless verify_counts).
  uint64_t* count_table() const { return count_table_; }
  // The copy-engine exchange (config copy_engines), or NULL.
  CopyEngineExchange* copy_engine() const { return copy_engine_.get(); }

 private:
  plugin::Logger logger_;
  NcclConfig config_;
  int device_ = 0;
  int rank_ = 0;
  int world_size_ = 1;
  int32_t* barrier_word_ = nullptr;  // device memory, one int, reduced in place by barrier()
  uint64_t* count_table_ = nullptr;
  std::unique_ptr<GuardedComm> comm_;
  std::unique_ptr<CopyEngineExchange> copy_engine_;  // made after comm_, gone before it
};

}  // namespace cad::nccl_comm
