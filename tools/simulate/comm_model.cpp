// comm_model.cpp -- collective times from the calibration's curves.
#include "comm_model.h"

#include <algorithm>
#include <cmath>

namespace cad::simulate {

namespace {

// Bus bandwidth at `bytes`: linear in log(bytes) between measured points, the end values outside.
double busbw_at(const std::vector<CurvePoint>& curve, double bytes) {
  if (bytes <= curve.front().bytes) return curve.front().busbw_GBps;
  if (bytes >= curve.back().bytes) return curve.back().busbw_GBps;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (bytes <= curve[i].bytes) {
      const double t = (std::log(bytes) - std::log(curve[i - 1].bytes)) /
                       (std::log(curve[i].bytes) - std::log(curve[i - 1].bytes));
      return curve[i - 1].busbw_GBps + t * (curve[i].busbw_GBps - curve[i - 1].busbw_GBps);
    }
  }
  return curve.back().busbw_GBps;
}

}  // namespace

double intra_node_seconds(const SystemCalibration& cal, double bytes) {
  if (bytes <= 0) return 0;
  // Below the smallest measured message the call costs what that message cost (latency-bound).
  const CurvePoint& first = cal.a2a_intra.front();
  const double floor_s = first.bytes / (first.busbw_GBps * 1e9);
  return std::max(floor_s, bytes / (busbw_at(cal.a2a_intra, bytes) * 1e9));
}

double inter_node_seconds(const SystemCalibration& cal, double bytes) {
  if (bytes <= 0) return 0;
  return cal.net_latency_us * 1e-6 + bytes / (cal.net_GBps_per_gpu * cal.net_efficiency * 1e9);
}

double all_to_all_seconds(const SystemCalibration& cal, const RankBytes& b) {
  return std::max(intra_node_seconds(cal, std::max(b.sent_intra, b.received_intra)),
                  inter_node_seconds(cal, std::max(b.sent_inter, b.received_inter)));
}

}  // namespace cad::simulate
