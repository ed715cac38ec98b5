// nccl_config.cpp -- see nccl_config.h.
#include "nccl_config.h"

#include <climits>
#include <cstdlib>

namespace cad::nccl_comm {

NcclConfig read_config(const char* config_json, const plugin::Logger& logger) {
  plugin::ConfigReader reader(config_json, "plugin 'nccl' config");
  NcclConfig config;
  config.device = static_cast<int>(reader.get_int("device", config.device, -1, 1023));
  config.bootstrap = reader.get_choice("bootstrap", config.bootstrap, {"auto", "host", "mpi"});
  config.timeout_ms = reader.get_int("timeout_ms", config.timeout_ms, 1, 7LL * 24 * 3600 * 1000);
  config.chunk_bytes =
      static_cast<uint64_t>(reader.get_int("chunk_bytes", static_cast<int64_t>(config.chunk_bytes), 1, INT64_MAX));
  config.verify_counts = reader.get_bool("verify_counts", config.verify_counts);
  config.blocking_comm = reader.get_bool("blocking_comm", config.blocking_comm);
  config.connect_peers = reader.get_bool("connect_peers", config.connect_peers);
  config.max_ctas = static_cast<int>(reader.get_int("max_ctas", config.max_ctas, 0, 64));
  config.copy_engines = reader.get_bool("copy_engines", config.copy_engines);
  config.copy_engine_slot_mib = reader.get_int("copy_engine_slot_mib", config.copy_engine_slot_mib, 1, 4096);
  reader.finish(logger);
  return config;
}

int choose_device(const NcclConfig& config) {
  if (config.device >= 0) return config.device;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && value[0] != '\0') return std::atoi(value);
  }
  return 0;
}

}  // namespace cad::nccl_comm
