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

namespace {

// Seconds at `bytes` on the fitted curve: linear between points, the first point's seconds below it (a
// latency floor), the last segment's slope above it (one point: its own bytes per second).
double curve_seconds(const std::vector<LinkPoint>& curve, double bytes) {
  if (bytes <= curve.front().bytes) return curve.front().seconds;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (bytes <= curve[i].bytes) {
      const double t = (bytes - curve[i - 1].bytes) / (curve[i].bytes - curve[i - 1].bytes);
      return curve[i - 1].seconds + t * (curve[i].seconds - curve[i - 1].seconds);
    }
  }
  const LinkPoint& last = curve.back();
  const double slope = curve.size() > 1 ? (last.seconds - curve[curve.size() - 2].seconds) /
                                              (last.bytes - curve[curve.size() - 2].bytes)
                                        : last.seconds / last.bytes;
  return last.seconds + (bytes - last.bytes) * slope;
}

}  // namespace

double inter_node_seconds(const SystemCalibration& cal, double bytes) {
  if (bytes <= 0) return 0;
  if (!cal.net_curve.empty()) return curve_seconds(cal.net_curve, bytes);
  return cal.net_latency_us * 1e-6 + bytes / (cal.net_GBps_per_gpu * cal.net_efficiency * 1e9);
}

double all_to_all_seconds(const SystemCalibration& cal, const RankBytes& b) {
  return std::max(intra_node_seconds(cal, std::max(b.sent_intra, b.received_intra)),
                  inter_node_seconds(cal, std::max(b.sent_inter, b.received_inter)));
}

double overlapped_seconds(double compute, double exchange, double overlap) {
  return compute + exchange - std::min(overlap * exchange, compute);
}

}  // namespace cad::simulate
