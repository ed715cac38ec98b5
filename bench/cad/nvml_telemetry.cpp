// nvml_telemetry.cpp -- NVML opened with dlopen (see nvml_telemetry.h).
#include "nvml_telemetry.h"

#include <dlfcn.h>

#include <cmath>
#include <limits>

namespace cad::bench {

// The few NVML declarations used here, written out because nvml.h is not part of the CUDA toolkit
// installed on every build machine (it ships with the driver's development files). They follow NVML's
// public C API: every call returns nvmlReturn_t (an enum, 0 = NVML_SUCCESS), a device is an opaque
// pointer (nvmlDevice_t), and the enums passed by value are C ints.
namespace {
constexpr int kNvmlSuccess = 0;          // NVML_SUCCESS
constexpr int kNvmlClockSm = 1;          // NVML_CLOCK_SM (nvmlClockType_t)
constexpr int kNvmlTemperatureGpu = 0;   // NVML_TEMPERATURE_GPU (nvmlTemperatureSensors_t)
using NvmlDevice = void*;                // nvmlDevice_t
}  // namespace

struct NvmlTelemetry::Api {
  int (*init)();                                                  // nvmlInit_v2
  int (*shutdown)();                                              // nvmlShutdown
  const char* (*error_string)(int);                               // nvmlErrorString
  int (*by_pci_bus_id)(const char*, NvmlDevice*);                 // nvmlDeviceGetHandleByPciBusId_v2
  int (*clock_info)(NvmlDevice, int, unsigned*);                  // nvmlDeviceGetClockInfo (MHz)
  int (*power_usage)(NvmlDevice, unsigned*);                      // nvmlDeviceGetPowerUsage (milliwatts)
  int (*temperature)(NvmlDevice, int, unsigned*);                 // nvmlDeviceGetTemperature (degrees C)
};

namespace {
template <class F>
bool resolve(void* library, const char* name, F*& out) {
  out = reinterpret_cast<F*>(dlsym(library, name));
  return out != nullptr;
}
}  // namespace

NvmlTelemetry::NvmlTelemetry(const std::string& pci_bus_id) {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* why = dlerror();
    reason_ = std::string("libnvidia-ml.so.1 not loaded: ") + (why ? why : "dlopen failed");
    return;
  }
  Api api{};
  const char* missing = nullptr;
  if (!resolve(library_, "nvmlInit_v2", api.init)) missing = "nvmlInit_v2";
  else if (!resolve(library_, "nvmlShutdown", api.shutdown)) missing = "nvmlShutdown";
  else if (!resolve(library_, "nvmlErrorString", api.error_string)) missing = "nvmlErrorString";
  else if (!resolve(library_, "nvmlDeviceGetHandleByPciBusId_v2", api.by_pci_bus_id)) missing = "nvmlDeviceGetHandleByPciBusId_v2";
  else if (!resolve(library_, "nvmlDeviceGetClockInfo", api.clock_info)) missing = "nvmlDeviceGetClockInfo";
  else if (!resolve(library_, "nvmlDeviceGetPowerUsage", api.power_usage)) missing = "nvmlDeviceGetPowerUsage";
  else if (!resolve(library_, "nvmlDeviceGetTemperature", api.temperature)) missing = "nvmlDeviceGetTemperature";
  if (missing != nullptr) {
    reason_ = std::string("libnvidia-ml.so.1 has no ") + missing;
    return;
  }
  if (const int st = api.init(); st != kNvmlSuccess) {
    reason_ = std::string("nvmlInit_v2: ") + api.error_string(st);
    return;
  }
  api_ = new Api(api);
  NvmlDevice device = nullptr;
  if (const int st = api.by_pci_bus_id(pci_bus_id.c_str(), &device); st != kNvmlSuccess) {
    reason_ = "nvmlDeviceGetHandleByPciBusId_v2(" + pci_bus_id + "): " + api.error_string(st);
    return;
  }
  // Every reading once now: a GPU that does not report one of them gives no telemetry at all, rather
  // than fields that are sometimes missing.
  device_ = device;
  const GpuSample first = sample();
  const char* failed = std::isnan(first.sm_clock_mhz) ? "the SM clock"
                       : std::isnan(first.power_w)    ? "the power draw"
                       : std::isnan(first.temperature_c) ? "the temperature"
                                                         : nullptr;
  if (failed != nullptr) {
    reason_ = std::string("NVML does not report ") + failed + " of GPU " + pci_bus_id;
    device_ = nullptr;
  }
}

NvmlTelemetry::~NvmlTelemetry() {
  if (api_ != nullptr) api_->shutdown();
  delete api_;
  if (library_ != nullptr) dlclose(library_);
}

GpuSample NvmlTelemetry::sample() const {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  GpuSample s{kNaN, kNaN, kNaN};
  if (device_ == nullptr) return s;
  unsigned value = 0;
  if (api_->clock_info(device_, kNvmlClockSm, &value) == kNvmlSuccess) s.sm_clock_mhz = value;
  if (api_->power_usage(device_, &value) == kNvmlSuccess) s.power_w = value / 1000.0;
  if (api_->temperature(device_, kNvmlTemperatureGpu, &value) == kNvmlSuccess) s.temperature_c = value;
  return s;
}

}  // namespace cad::bench
