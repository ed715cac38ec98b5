// system_calibration.h -- what one GPU kind and its machines do outside the attention kernel: the GEMM
// rate of the linear layers, the memory-bound per-token work around them, the all_to_all_v bandwidth
// curve inside a node and the network between nodes. One JSON file per GPU kind (e.g.
// configs/calibration/h200_system.json); the attention-kernel rates live in the sibling rate table.
//
// Schema (every key required; every section carries "source": the command that measured it, or
// "assumed: <why>"):
//   {
//     "gpu": "NVIDIA H200",
//     "gemm": {"tflops": 660, "source": "..."},
//     "elementwise": {"hbm_GBps": 4000, "bytes_per_token_layer_per_hidden": 48, "source": "..."},
//     "all_to_all_intra_node": {"source": "...", "points": [{"bytes_per_rank": 786432, "busbw_GBps": 5.0}, ...]},
//     "network": {"GBps_per_gpu": 50, "efficiency": 0.8, "latency_us": 30, "source": "..."}
//   }
// "bytes_per_rank" is what one GPU sends to the other GPUs of the call (its message to itself excluded),
// strictly increasing; busbw = those bytes / time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cad::simulate {

struct CurvePoint {
  double bytes = 0;      // per rank, to other GPUs
  double busbw_GBps = 0;  // 1e9 bytes per second
};

struct SystemCalibration {
  std::string path;
  std::string gpu;
  double gemm_tflops = 0;
  std::string gemm_source;
  double hbm_GBps = 0;
  double elementwise_bytes_per_token_layer_per_hidden = 0;  // forward; backward counts twice
  std::string elementwise_source;
  std::vector<CurvePoint> a2a_intra;
  std::string a2a_intra_source;
  double net_GBps_per_gpu = 0;
  double net_efficiency = 1;
  double net_latency_us = 0;
  std::string net_source;
};

// Throws std::invalid_argument "FILE: key 'a.b' ..." naming the missing or bad key and what was expected.
SystemCalibration load_system_calibration(const std::string& path);
SystemCalibration parse_system_calibration(const std::string& json_text, const std::string& name);

}  // namespace cad::simulate
