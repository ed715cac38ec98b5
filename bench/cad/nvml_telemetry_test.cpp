// nvml_telemetry_test.cpp -- NvmlTelemetry refuses what it cannot read, with a reason, on any machine:
// without the driver's NVML (a CPU-only build machine) and with it (a GPU machine, for a bus id that
// names no GPU). cad_server_bench relies on this to print its notice and leave the telemetry fields out.
#include "nvml_telemetry.h"

#include <gtest/gtest.h>

#include <cmath>

namespace {

TEST(NvmlTelemetry, UnknownGpuGivesNoTelemetryAndSaysWhy) {
  const std::string bus_id = "ffff:ff:1f.7";  // no machine has a GPU at the last possible PCI address
  const cad::bench::NvmlTelemetry nvml(bus_id);
  EXPECT_FALSE(nvml.available());
  // Either NVML is missing (no driver here) or it is there and names the bus id it could not find.
  const std::string& why = nvml.reason();
  EXPECT_TRUE(why.find("libnvidia-ml.so.1") != std::string::npos || why.find(bus_id) != std::string::npos) << why;
  const cad::bench::GpuSample s = nvml.sample();
  EXPECT_TRUE(std::isnan(s.sm_clock_mhz) && std::isnan(s.power_w) && std::isnan(s.temperature_c));
}

}  // namespace
