// nvml_telemetry.h -- the GPU's SM clock, power and temperature read through NVML, loaded at run time.
//
// A benchmark that times the same batch at different moments needs to see whether the GPU's clock moved
// in between (power capping, heat): cad_server_bench samples these after every timed call. NVML is the
// driver's library (libnvidia-ml.so.1), not part of the CUDA toolkit; it is opened with dlopen so that the
// benchmark builds without it and runs, without telemetry, where it is missing.
#pragma once

#include <string>

namespace cad::bench {

// One reading. power_w is what nvmlDeviceGetPowerUsage reports (on recent GPUs a running average over
// about one second, not the instantaneous draw).
struct GpuSample {
  double sm_clock_mhz = 0, power_w = 0, temperature_c = 0;
};

class NvmlTelemetry {
 public:
  // Opens NVML for the CUDA device with this PCI bus id (cudaDeviceGetPCIBusId's text, so a remapped
  // CUDA_VISIBLE_DEVICES still finds the right GPU). When anything is missing, available() is false and
  // reason() says what.
  explicit NvmlTelemetry(const std::string& pci_bus_id);
  ~NvmlTelemetry();
  NvmlTelemetry(const NvmlTelemetry&) = delete;
  NvmlTelemetry& operator=(const NvmlTelemetry&) = delete;

  bool available() const { return device_ != nullptr; }
  const std::string& reason() const { return reason_; }
  // The current reading; a call that fails (it did not when the device was opened) gives NaN.
  GpuSample sample() const;

 private:
  struct Api;
  void* library_ = nullptr;
  Api* api_ = nullptr;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string reason_;
};

}  // namespace cad::bench
