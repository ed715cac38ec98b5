// mpi_config.cpp -- the "mpi" plugin's JSON config: keys, types, ranges.
#include <algorithm>
#include <climits>
#include <set>

#include "mpi_context.h"

namespace cad::mpi_comm {

using plugin::fail;

MpiConfig read_config(const char* config_json, const plugin::Logger& logger) {
  const std::string source = "plugin 'mpi' config";
  plugin::ConfigReader reader(config_json, source);
  MpiConfig config;
  config.timeout_ms = reader.get_int("timeout_ms", config.timeout_ms, 1, 7LL * 24 * 3600 * 1000);
  config.chunk_bytes = static_cast<uint64_t>(reader.get_int("chunk_bytes", static_cast<int64_t>(config.chunk_bytes), 1, INT_MAX));
  config.verify_counts = reader.get_bool("verify_counts", config.verify_counts);

  const bool has_color = reader.has("split_color");
  const bool has_key = reader.has("split_key");
  config.split_color = static_cast<int>(reader.get_int("split_color", 0, 0, INT_MAX));
  config.split_key = static_cast<int>(reader.get_int("split_key", 0, INT_MIN, INT_MAX));
  config.split_key_given = has_key;
  if (has_key && !has_color) fail(CAD_STATUS_INVALID_CONFIG, source + ": key 'split_key' needs 'split_color' too");
  config.use_split = has_color;

  const nlohmann::json ranks = reader.get_json("ranks");
  if (!ranks.is_null()) {
    if (config.use_split) {
      fail(CAD_STATUS_INVALID_CONFIG, source + ": keys 'ranks' and 'split_color' exclude each other (choose one way "
                                               "to form the sub-communicator)");
    }
    if (!ranks.is_array() || ranks.empty()) {
      fail(CAD_STATUS_INVALID_CONFIG, source + ": key 'ranks': expected a non-empty array of distinct world ranks, got " +
                                          ranks.dump());
    }
    std::set<int> seen;
    for (const auto& r : ranks) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > INT_MAX ||
          !seen.insert(r.get<int>()).second) {
        fail(CAD_STATUS_INVALID_CONFIG, source + ": key 'ranks': expected a non-empty array of distinct world "
                                                 "ranks (integers >= 0), got " + ranks.dump());
      }
      config.ranks.push_back(r.get<int>());
    }
  }
  reader.finish(logger);
  return config;
}

}  // namespace cad::mpi_comm
