// calibration_fixture.h -- a system calibration built in code for the tests, with round numbers that
// hand calculations can follow. Network: 50 GB/s per GPU x 0.8, 20 us per call.
#pragma once

#include <utility>
#include <vector>

#include "system_calibration.h"

namespace cad::simulate::testing {

inline SystemCalibration calibration(double gemm_tflops, double hbm_GBps, double elementwise_bytes,
                                     std::vector<CurvePoint> nvlink_curve) {
  SystemCalibration c;
  c.gpu = "test";
  c.gemm_tflops = gemm_tflops;
  c.hbm_GBps = hbm_GBps;
  c.elementwise_bytes_per_token_layer_per_hidden = elementwise_bytes;
  c.a2a_intra = std::move(nvlink_curve);
  c.net_GBps_per_gpu = 50;
  c.net_efficiency = 0.8;
  c.net_latency_us = 20;
  return c;
}

}  // namespace cad::simulate::testing
