// comm_model.h -- how long one GPU's part of a collective takes, from the bytes it sends and receives.
//
// all_to_all_v: bytes to and from GPUs of the same node go over NVLink at the measured bus bandwidth for
// that message size (the curve, interpolated in log(bytes), clamped at its ends, never faster than the
// smallest measured call); bytes to and from other nodes go over the GPU's own network link
// (GBps_per_gpu x efficiency, plus a latency; or the fitted (bytes, seconds) curve when the calibration holds
// one: linear between its points, its first point's seconds below it, its last segment's slope above it).
// The two run at the same time, and each direction of a
// link is separate, so a GPU's time is max(intra(max(sent, received)), inter(max(sent, received))).
#pragma once

#include "system_calibration.h"

namespace cad::simulate {

struct RankBytes {
  double sent_intra = 0, received_intra = 0;  // to/from other GPUs of the node
  double sent_inter = 0, received_inter = 0;  // to/from GPUs of other nodes
};

// Seconds for `bytes` (per GPU, to its peers) inside one node; 0 for 0 bytes.
double intra_node_seconds(const SystemCalibration& cal, double bytes);
// Seconds for `bytes` (per GPU) across the network; 0 for 0 bytes.
double inter_node_seconds(const SystemCalibration& cal, double bytes);
// One GPU's all_to_all_v.
double all_to_all_seconds(const SystemCalibration& cal, const RankBytes& bytes);
// A pass of `compute` seconds with an exchange of `exchange` seconds, the exchange hidden under the compute
// by `overlap` (its share hidden, at most the compute): compute + exchange - min(overlap x exchange, compute).
// overlap 0 is the exchange fully exposed; overlap 1 is max(compute, exchange).
double overlapped_seconds(double compute, double exchange, double overlap);

}  // namespace cad::simulate
