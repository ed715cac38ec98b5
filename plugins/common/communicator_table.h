// communicator_table.h -- the cad_communicator_v1_t table of a communicator plugin, built from what is its own:
// the context class and its three collectives. Every communicator's entry points then check their arguments,
// turn failures into statuses (guarded(): no exception crosses the boundary) and word their errors the same way;
// a plugin's *_plugin.cpp says only how it runs the collectives on its context and what device it reports.
//
// Ops is a struct of static functions:
//   using Context = ...;        made by plugin::create_context<Context> (constructor (services, config)), holds
//                               `ErrorState error` and gives int32_t rank() const, int32_t world_size() const
//   static cad_device_v1_t device(const Context&);
//   static void all_to_all_v(Context&, const void* send, const uint64_t* send_counts, const uint64_t* send_displs,
//                            void* recv, const uint64_t* recv_counts, const uint64_t* recv_displs, void* stream);
//   static void all_gather(Context&, const void* send, uint64_t bytes, void* recv, void* stream);
//   static void barrier(Context&, void* stream);
// each of which throws plugin::Failure (plugin::fail) on error.
#pragma once

#include <string>

#include "plugin_support.h"

namespace cad::plugin {

// For a communicator whose buffers are host memory: a stream argument is refused, naming the plugin.
inline void require_no_stream(void* stream, const char* plugin_name, const char* operation) {
  if (stream != nullptr) {
    fail(CAD_STATUS_INVALID_ARGUMENT, std::string(operation) + ": stream must be NULL for the CPU communicator '" +
                                          plugin_name + "' (buffers are host memory)");
  }
}

template <class Ops>
struct CommunicatorTable {
  using Context = typename Ops::Context;

  // An entry point with a NULL ctx has nowhere to store the message; it only returns the status.
  template <class Body>
  static cad_status_t entry(void* ctx, Body&& body) noexcept {
    if (ctx == nullptr) return CAD_STATUS_INVALID_ARGUMENT;
    Context& c = *static_cast<Context*>(ctx);
    return guarded(c.error, [&] { body(c); });
  }

  static cad_status_t create(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                             char* error_message, size_t error_capacity) {
    return create_context<Context>(services, config_json, out_ctx, error_message, error_capacity);
  }

  static void destroy(void* ctx) {
    try {
      delete static_cast<Context*>(ctx);
    } catch (...) {
      // Destruction never throws out of the plugin.
    }
  }

  static const char* last_error(void* ctx) {
    return ctx == nullptr ? "ctx is NULL" : static_cast<Context*>(ctx)->error.text();
  }

  static cad_status_t get_rank(void* ctx, int32_t* out_rank) {
    return entry(ctx, [&](Context& c) {
      if (out_rank == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_rank: out_rank is NULL");
      *out_rank = c.rank();
    });
  }

  static cad_status_t get_world_size(void* ctx, int32_t* out_world_size) {
    return entry(ctx, [&](Context& c) {
      if (out_world_size == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_world_size: out_world_size is NULL");
      *out_world_size = c.world_size();
    });
  }

  static cad_status_t get_device(void* ctx, cad_device_v1_t* out_device) {
    return entry(ctx, [&](Context& c) {
      if (out_device == nullptr) fail(CAD_STATUS_INVALID_ARGUMENT, "get_device: out_device is NULL");
      *out_device = Ops::device(c);
    });
  }

  static cad_status_t all_to_all_v(void* ctx, const void* send, const uint64_t* send_counts,
                                   const uint64_t* send_displs, void* recv, const uint64_t* recv_counts,
                                   const uint64_t* recv_displs, void* stream) {
    return entry(ctx, [&](Context& c) {
      Ops::all_to_all_v(c, send, send_counts, send_displs, recv, recv_counts, recv_displs, stream);
    });
  }

  static cad_status_t all_gather(void* ctx, const void* send, uint64_t bytes, void* recv, void* stream) {
    return entry(ctx, [&](Context& c) { Ops::all_gather(c, send, bytes, recv, stream); });
  }

  static cad_status_t barrier(void* ctx, void* stream) {
    return entry(ctx, [&](Context& c) { Ops::barrier(c, stream); });
  }

  static constexpr cad_communicator_v1_t kTable = {
      sizeof(cad_communicator_v1_t), create,       destroy,    last_error, get_rank,
      get_world_size,                get_device,   all_to_all_v, all_gather, barrier,
  };
};

}  // namespace cad::plugin
