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
//
// The network term is explicit (`cad simulate --link-gbps --link-latency-us --link-efficiency --link-curve
// --overlap`, docs/simulate.md "The network term"): bytes that leave a GPU's node take latency + bytes /
// (GBps_per_gpu x efficiency), or, with a fitted curve of (bytes, seconds) points, the curve's seconds; the
// ping-pong mode ("on") hides `overlap` of a pass's exchange, at most the pass's compute. overlap = 1 is the
// old assumption (ping-pong hides all of it up to the compute); what has been measured is far less
// (bench/results/trainer_h200x2_2026-11-28_6fc2a34_{4,5}).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cad::simulate {

struct CurvePoint {
  double bytes = 0;      // per rank, to other GPUs
  double busbw_GBps = 0;  // 1e9 bytes per second
};

// One measured or fitted point of the network curve: a GPU's all_to_all_v with `bytes` to and from GPUs of
// other nodes (the larger of sent and received) took `seconds`.
struct LinkPoint {
  double bytes = 0;
  double seconds = 0;
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
  // When not empty, replaces latency + bytes / bandwidth (load_link_curve); strictly increasing bytes.
  std::vector<LinkPoint> net_curve;
  // The share of a pass's exchange the ping-pong mode hides, at most the pass's compute: [0, 1].
  double overlap = 1;
  std::string overlap_source = "assumed: ping-pong hides the whole exchange up to the compute (unmeasured)";
};

// A fitted network curve: {"source": "...", "points": [{"bytes": B, "seconds": S}, ...]} with bytes strictly
// increasing and seconds > 0 and non-decreasing. Throws std::invalid_argument naming the file and the key.
std::vector<LinkPoint> load_link_curve(const std::string& path, std::string* source = nullptr);
std::vector<LinkPoint> parse_link_curve(const std::string& json_text, const std::string& name, std::string* source);

// Throws std::invalid_argument "FILE: key 'a.b' ..." naming the missing or bad key and what was expected.
SystemCalibration load_system_calibration(const std::string& path);
SystemCalibration parse_system_calibration(const std::string& json_text, const std::string& name);

}  // namespace cad::simulate
