// mpi_plugin.cpp -- the "mpi" communicator's ABI table and entry symbol. Every entry point is
// wrapped in guarded() so that no exception crosses the boundary.
#include "mpi_collectives.h"
#include "mpi_context.h"

namespace cad::mpi_comm {
namespace {

using plugin::fail;
using plugin::guarded;

MpiContext& context(void* ctx) {
  if (ctx == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "ctx is NULL");
  return *static_cast<MpiContext*>(ctx);
}

// An entry point with a NULL ctx has nowhere to store the message; it only returns the status.
template <class Body>
cad_status_t entry(void* ctx, Body&& body) noexcept {
  if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
  MpiContext& c = context(ctx);
  return guarded(c.error, [&] { body(c); });
}

void check_stream(void* stream, const char* operation) {
  if (stream != nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT,
         std::string(operation) + ": stream must be NULL for the CPU communicator 'mpi' (buffers are host memory)");
  }
}

cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                    char* error_message, size_t error_capacity) {
  return plugin::create_context<MpiContext>(services, config_json, out_ctx, error_message, error_capacity);
}

void destroy(void* ctx) {
  try {
    delete static_cast<MpiContext*>(ctx);
  } catch (...) {
    // Destruction never throws out of the plugin.
  }
}

const char* last_error(void* ctx) {
  if (ctx == nullptr) return "ctx is NULL";
  return static_cast<MpiContext*>(ctx)->error.text();
}

cad_status_t get_rank(void* ctx, int32_t* out_rank) {
  return entry(ctx, [&](MpiContext& c) {
    if (out_rank == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_rank: out_rank is NULL");
    *out_rank = c.rank();
  });
}

cad_status_t get_world_size(void* ctx, int32_t* out_world_size) {
  return entry(ctx, [&](MpiContext& c) {
    if (out_world_size == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_world_size: out_world_size is NULL");
    *out_world_size = c.world_size();
  });
}

cad_status_t get_device(void* ctx, cad_device_v1_t* out_device) {
  return entry(ctx, [&](MpiContext&) {
    if (out_device == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_device: out_device is NULL");
    *out_device = cad_device_v1_t{CAD_DEVICE_CPU, 0};
  });
}

cad_status_t all_to_all_v_entry(void* ctx, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
                                void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream) {
  return entry(ctx, [&](MpiContext& c) {
    check_stream(stream, "all_to_all_v");
    all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  });
}

cad_status_t all_gather_entry(void* ctx, const void* send, uint64_t bytes, void* recv, void* stream) {
  return entry(ctx, [&](MpiContext& c) {
    check_stream(stream, "all_gather");
    all_gather(c, send, bytes, recv);
  });
}

cad_status_t barrier_entry(void* ctx, void* stream) {
  return entry(ctx, [&](MpiContext& c) {
    check_stream(stream, "barrier");
    barrier(c);
  });
}

const cad_communicator_v1_t kCommunicator = {
    sizeof(cad_communicator_v1_t), create, destroy, last_error, get_rank, get_world_size, get_device,
    all_to_all_v_entry, all_gather_entry, barrier_entry,
};

const cad_plugin_v1_t kPlugin = {
    sizeof(cad_plugin_v1_t),
    CAD_ABI_VERSION_MAJOR,
    CAD_ABI_VERSION_MINOR,
    CAD_PLUGIN_KIND_COMMUNICATOR,
    "mpi",
    "0.1.0",
    "CPU communicator over OpenMPI: nonblocking point-to-point with deadlines, byte-count agreement",
    nullptr,
    &kCommunicator,
    nullptr,
};

}  // namespace
}  // namespace cad::mpi_comm

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &cad::mpi_comm::kPlugin; }
