// device_path_none.cpp -- the CUDA data path's stand-in for builds without CUDA: context.cpp refuses a
// CUDA server backend before anything here could be reached.
#include "device_path.h"

namespace cad::cad_plugin {

bool device_path_available() { return false; }
void check_call_stream(void*, int, const char*) {}

struct DevicePlan {};
struct DeviceSaved {};
struct DeviceRuntime {};

void DeviceSavedDeleter::operator()(DeviceSaved* saved) const { delete saved; }
void DeviceRuntimeDeleter::operator()(DeviceRuntime* runtime) const { delete runtime; }

DevicePlan* make_device_plan(CadContext&, const Step&, int32_t, void*) {
  plugin::fail(CAD_STATUS_UNSUPPORTED, "cad: this build has no CUDA data path (CAD_ENABLE_CUDA=OFF)");
}
void release_device_plan(CadContext&, DevicePlan* plan) { delete plan; }
int64_t device_plan_bytes(DevicePlan&) { return 0; }
void harvest_gpu_times(CadContext&) {}

void device_forward(CadContext&, CadPlan&, const CallShape&, const cad_attention_forward_args_v1_t*, Saved*, CallStats&,
                    bool) {
  plugin::fail(CAD_STATUS_UNSUPPORTED, "cad: this build has no CUDA data path (CAD_ENABLE_CUDA=OFF)");
}
void device_backward(CadContext&, CadPlan&, const CallShape&, const cad_attention_backward_args_v1_t*, Saved*,
                     CallStats&, bool) {
  plugin::fail(CAD_STATUS_UNSUPPORTED, "cad: this build has no CUDA data path (CAD_ENABLE_CUDA=OFF)");
}

}  // namespace cad::cad_plugin
