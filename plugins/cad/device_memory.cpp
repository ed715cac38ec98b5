// device_memory.cpp -- see device_memory.h.
#include "device_memory.h"

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

DeviceBuffer allocate(CadContext& ctx, int device, size_t bytes, void* stream, const char* what) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  const cad_host_services_v1_t* s = ctx.logger.services();
  if (s->allocate(s->host_ctx, {CAD_DEVICE_CUDA, device}, bytes, stream, &b.ptr) != CAD_STATUS_OK || b.ptr == nullptr) {
    fail(CAD_STATUS_OUT_OF_MEMORY, format("cad: the host could not allocate %zu bytes of device memory for %s", bytes, what));
  }
  b.bytes = bytes;
  return b;
}

void release(CadContext& ctx, int device, DeviceBuffer& b, void* stream) {
  if (b.ptr == nullptr) return;
  const cad_host_services_v1_t* s = ctx.logger.services();
  s->free(s->host_ctx, {CAD_DEVICE_CUDA, device}, b.ptr, stream);
  b.ptr = nullptr;
}

void DeviceSavedDeleter::operator()(DeviceSaved* saved) const {
  if (saved == nullptr) return;
  for (DeviceBuffer* b : saved->buffers()) release(*ctx, saved->device, *b, saved->stream);
  delete saved;
}

}  // namespace cad::cad_plugin
