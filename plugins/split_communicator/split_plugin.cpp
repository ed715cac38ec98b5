// split_plugin.cpp -- the "split" communicator's ABI table and entry symbol. Every entry point is wrapped in
// guarded() so that no exception crosses the boundary.
#include "split_context.h"

namespace cad::split_comm {
namespace {

using plugin::fail;
using plugin::guarded;

template <class Body>
cad_status_t entry(void* ctx, Body&& body) noexcept {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;  // nowhere to store a message
  SplitContext& c = *static_cast<SplitContext*>(ctx);
  return guarded(c.error, [&] { body(c); });
}

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                    char* error_message, size_t error_capacity) {
  return plugin::create_context<SplitContext>(services, config_json, out_ctx, error_message, error_capacity);
}

void destroy(void* ctx) { delete static_cast<SplitContext*>(ctx); }

const char* last_error(void* ctx) {
  return ctx == nullptr ? "ctx is NULL" : static_cast<SplitContext*>(ctx)->error.text();
}

cad_status_t get_rank(void* ctx, int32_t* out) {
  return entry(ctx, [&](SplitContext& c) {
    if (out == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_rank: out_rank is NULL");
    *out = c.rank();
  });
}

cad_status_t get_world_size(void* ctx, int32_t* out) {
  return entry(ctx, [&](SplitContext& c) {
    if (out == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_world_size: out_world_size is NULL");
    *out = c.world_size();
  });
}

cad_status_t get_device(void* ctx, cad_device_v1_t* out) {
  return entry(ctx, [&](SplitContext& c) {
    if (out == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_device: out_device is NULL");
    *out = c.device();
  });
}

cad_status_t all_to_all_v(void* ctx, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                          void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream) {
  return entry(ctx, [&](SplitContext& c) {
    c.all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, stream);
  });
}

cad_status_t all_gather(void* ctx, const void* send, uint64_t bytes, void* recv, void* stream) {
  return entry(ctx, [&](SplitContext& c) { c.all_gather(send, bytes, recv, stream); });
}

cad_status_t barrier(void* ctx, void* stream) {
  return entry(ctx, [&](SplitContext& c) { c.barrier(stream); });
}

const cad_communicator_v1_t kCommunicator = {
    sizeof(cad_communicator_v1_t), create, destroy, last_error, get_rank, get_world_size, get_device,
    all_to_all_v, all_gather, barrier,
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_COMMUNICATOR,
    "split",
    "0.1.0",
    "Node-split communicator: pairs inside a node over one borrowed communicator, pairs across nodes over another",
    nullptr,
    &kCommunicator,
    nullptr,
};

}  // namespace
}  // namespace cad::split_comm

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &cad::split_comm::kPlugin; }
