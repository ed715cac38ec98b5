// nccl_context.cpp -- creating and destroying one "nccl" communicator instance.
#include "nccl_context.h"

#include "nccl_collectives.h"
#include "nccl_errors.h"

namespace cad::nccl_comm {

using plugin::fail;
using plugin::format;

NcclContext::NcclContext(const cad_host_services_v1_t* services, const char* config_json)
    : logger_(services, "nccl"), config_(read_config(config_json, logger_)) {
  // Config problems first (no CUDA, no communication), so they are reported as such everywhere.
  const std::string method = choose_bootstrap(config_, services);
  device_ = choose_device(config_);
  int device_count = 0;
  check_cuda(cudaGetDeviceCount(&device_count), "create: cudaGetDeviceCount");
  if (device_ >= device_count) {
    fail(CAD_STATUS_INVALID_CONFIG, format("plugin 'nccl' config: device %d does not exist (%d CUDA device(s) "
                                           "visible); set key 'device' or the launcher's local rank",
                                           device_, device_count));
  }
  const Bootstrap boot = bootstrap(method, config_, services, logger_);
  rank_ = boot.rank;
  world_size_ = boot.world_size;
  {
    DeviceScope scope(device_);
    check_cuda(cudaMalloc(&barrier_word_, sizeof(int32_t)), "create: cudaMalloc of the barrier word");
    if (config_.verify_counts) {
      const size_t words = 2 * static_cast<size_t>(world_size_) * (static_cast<size_t>(world_size_) + 1);
      const cudaError_t allocated = cudaMalloc(&count_table_, words * sizeof(uint64_t));
      if (allocated != cudaSuccess) cudaFree(barrier_word_);
      check_cuda(allocated, "create: cudaMalloc of the count table");
    }
  }
  try {
    comm_ = std::make_unique<GuardedComm>(device_, rank_, world_size_, boot.id, config_.timeout_ms,
                                          config_.blocking_comm, config_.max_ctas, logger_);
    if (config_.connect_peers) connect_peers(*this);
    if (config_.copy_engines && world_size_ > 1) {
      copy_engine_ = std::make_unique<CopyEngineExchange>(*this, static_cast<uint64_t>(config_.copy_engine_slot_mib) << 20);
      CopyEngineExchange* exchange = copy_engine_.get();
      comm_->set_on_abort([exchange] { exchange->release(); });
    }
  } catch (...) {
    if (comm_) comm_->set_on_abort(nullptr);
    copy_engine_.reset();
    comm_.reset();
    cudaFree(barrier_word_);
    cudaFree(count_table_);
    throw;
  }
  logger_.debug(format("rank %d of %d on CUDA device %d (bootstrap: %s%s%s)", rank_, world_size_, device_,
                       boot.method.c_str(), config_.connect_peers ? ", every peer connected" : "",
                       copy_engine_ ? ", all_to_all_v by the copy engines" : ""));
}

NcclContext::~NcclContext() {
  if (comm_) comm_->set_on_abort(nullptr);
  copy_engine_.reset();  // releases its waits first: a peer that is gone cannot hang it
  comm_.reset();  // joins the watchdog, then finalises or aborts the NCCL communicator
  cudaFree(barrier_word_);
  cudaFree(count_table_);
}

}  // namespace cad::nccl_comm
