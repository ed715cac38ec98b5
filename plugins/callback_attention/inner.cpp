// inner.cpp -- see inner.h.
#include "inner.h"

#include <algorithm>

namespace cad::callback_attention {

using cad::plugin::fail;
using cad::plugin::format;

const char* direction_name(Direction d) { return d == Direction::Forward ? "forward" : "backward"; }

bool Inner::has_plans() const {
  return CAD_HAS_FIELD(cad_attention_v1_t, table, release_plan) && table->make_plan != nullptr &&
         table->release_plan != nullptr;
}

std::string Inner::last_error() const {
  const char* message = table->last_error != nullptr ? table->last_error(instance) : nullptr;
  return message != nullptr && message[0] ? message : "(no message)";
}

std::optional<Inner> read_inner(cad::plugin::ConfigReader& config, const cad_host_services_v1_t* services) {
  const char* where = "plugin 'callback_attention' config";
  const bool named = config.has("inner"), runs_given = config.has("inner_runs");
  if (!named && !runs_given) return std::nullopt;
  if (named != runs_given) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("%s: '%s' is given without '%s': 'inner' names an attention instance listed before this one and "
                "'inner_runs' the direction it runs (\"forward\" or \"backward\"); the callbacks run the other",
                where, named ? "inner" : "inner_runs", named ? "inner_runs" : "inner"));
  }
  Inner inner;
  inner.name = config.get_string("inner", "");
  if (inner.name.empty()) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s: 'inner' must name an attention instance (e.g. \"server_inner\"), "
                                           "got an empty string", where));
  }
  inner.runs = config.get_choice("inner_runs", "forward", {"forward", "backward"}) == "forward" ? Direction::Forward
                                                                                               : Direction::Backward;
  const void* table = nullptr;
  void* instance = nullptr;
  if (services->lookup_plugin == nullptr ||
      services->lookup_plugin(services->host_ctx, inner.name.c_str(), CAD_PLUGIN_KIND_ATTENTION, &table, &instance) !=
          CAD_STATUS_OK ||
      table == nullptr) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s: 'inner' names '%s', but the host has no attention instance of that "
                                           "name (it must be listed before this instance)", where, inner.name.c_str()));
  }
  inner.table = static_cast<const cad_attention_v1_t*>(table);
  inner.instance = instance;
  if (inner.table->get_capabilities == nullptr || inner.table->forward == nullptr ||
      inner.table->backward == nullptr || inner.table->last_error == nullptr) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s: inner instance '%s' lacks attention functions", where, inner.name.c_str()));
  }
  inner.caps.struct_size = sizeof(inner.caps);
  if (inner.table->get_capabilities(inner.instance, &inner.caps) != CAD_STATUS_OK) {
    fail(CAD_STATUS_INTERNAL, format("%s: inner instance '%s': get_capabilities failed: %s", where, inner.name.c_str(),
                                     inner.last_error().c_str()));
  }
  if (inner.caps.flags & CAD_ATTENTION_CAP_PIECES) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s: inner instance '%s' takes pieces (a distributed backend); it must "
                                           "take segments, as a server backend does", where, inner.name.c_str()));
  }
  if (inner.runs == Direction::Backward && !(inner.caps.flags & CAD_ATTENTION_CAP_BACKWARD)) {
    fail(CAD_STATUS_INVALID_CONFIG, format("%s: 'inner_runs' is \"backward\" but inner instance '%s' has no backward",
                                           where, inner.name.c_str()));
  }
  return inner;
}

cad_attention_capabilities_v1_t combined(const cad_attention_capabilities_v1_t& callbacks, bool callbacks_backward,
                                         const Inner& inner, const std::string& key) {
  const cad_attention_capabilities_v1_t& in = inner.caps;
  const std::string both = format("the callbacks registered under '%s' and inner instance '%s'", key.c_str(),
                                  inner.name.c_str());
  if (callbacks.device_type != in.device_type) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("plugin 'callback_attention' config: %s run on different devices (device types %d and %d); the two "
                "directions of one server batch must run where its tensors are", both.c_str(), callbacks.device_type,
                in.device_type));
  }
  cad_attention_capabilities_v1_t out = callbacks;
  out.dtype_mask = callbacks.dtype_mask & in.dtype_mask;
  out.head_dim_mask = callbacks.head_dim_mask & in.head_dim_mask;
  out.max_head_dim = std::min(callbacks.max_head_dim, in.max_head_dim);
  out.min_compute_capability = std::max(callbacks.min_compute_capability, in.min_compute_capability);
  if (out.dtype_mask == 0 || out.head_dim_mask == 0) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("plugin 'callback_attention' config: %s share no %s (0x%x and 0x%x)", both.c_str(),
                out.dtype_mask == 0 ? "dtype (dtype_mask" : "head dim (head_dim_mask",
                out.dtype_mask == 0 ? callbacks.dtype_mask : callbacks.head_dim_mask,
                out.dtype_mask == 0 ? in.dtype_mask : in.head_dim_mask));
  }
  // Mask kinds and batch shapes both directions must take; the backward is whoever runs it.
  const uint32_t shared = CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL | CAD_ATTENTION_CAP_GQA |
                          CAD_ATTENTION_CAP_SHARED_KV | CAD_ATTENTION_CAP_WINDOW;
  out.flags = callbacks.flags & in.flags & shared;
  const bool backward = inner.runs == Direction::Backward ? (in.flags & CAD_ATTENTION_CAP_BACKWARD) != 0
                                                          : callbacks_backward;
  if (backward) out.flags |= CAD_ATTENTION_CAP_BACKWARD;
  return out;
}

}  // namespace cad::callback_attention
