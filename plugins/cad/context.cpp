// context.cpp -- see context.h.
#include "context.h"

#include "device_path.h"

#include <limits>

namespace cad::cad_plugin {

using plugin::fail;
using plugin::format;

namespace {

const char* kind_name(cad_plugin_kind_t kind) {
  switch (kind) {
    case CAD_PLUGIN_KIND_ATTENTION: return "attention";
    case CAD_PLUGIN_KIND_COMMUNICATOR: return "communicator";
    case CAD_PLUGIN_KIND_BALANCER: return "balancer";
  }
  return "unknown";
}

// Borrows an instance the host created before this one.
const void* lookup(const cad_host_services_v1_t* services, const std::string& name, cad_plugin_kind_t kind,
                   void** instance) {
  if (services->lookup_plugin == nullptr) {
    fail(CAD_STATUS_NOT_FOUND, format("plugin 'cad': the host lends no lookup_plugin service, so the %s instance "
                                      "'%s' cannot be found", kind_name(kind), name.c_str()));
  }
  const void* table = nullptr;
  void* found = nullptr;
  const cad_status_t status = services->lookup_plugin(services->host_ctx, name.c_str(), kind, &table, &found);
  if (status != CAD_STATUS_OK || table == nullptr) {
    fail(CAD_STATUS_NOT_FOUND, format("plugin 'cad': no %s instance named '%s' (it must be listed before the CAD "
                                      "instance in the host's config)", kind_name(kind), name.c_str()));
  }
  *instance = found;
  return table;
}

std::string required_name(plugin::ConfigReader& reader, const char* key) {
  const std::string value = reader.get_string(key, "");
  if (value.empty()) {
    fail(CAD_STATUS_INVALID_CONFIG,
         format("plugin 'cad' config: key '%s' is missing: expected the name of an instance in the host's config", key));
  }
  return value;
}

// A server backend instance the host lends (`name` in its config), checked for what server batches need.
ServerBackend borrow_server_backend(const cad_host_services_v1_t* services, const std::string& name) {
  ServerBackend server;
  server.table = static_cast<const cad_attention_v1_t*>(lookup(services, name, CAD_PLUGIN_KIND_ATTENTION, &server.instance));
  server.name = name;
  if (server.table->get_capabilities == nullptr || server.table->forward == nullptr ||
      server.table->backward == nullptr || server.table->last_error == nullptr) {
    fail(CAD_STATUS_ABI_MISMATCH, "plugin 'cad': server backend instance '" + server.name + "' lacks functions");
  }
  server.caps.struct_size = sizeof(server.caps);
  if (server.table->get_capabilities(server.instance, &server.caps) != CAD_STATUS_OK) {
    fail(CAD_STATUS_INTERNAL, "plugin 'cad': server backend instance '" + server.name +
                                  "': get_capabilities failed: " + server.table->last_error(server.instance));
  }
  if (server.caps.flags & CAD_ATTENTION_CAP_PIECES) {
    fail(CAD_STATUS_UNSUPPORTED, "plugin 'cad': server backend instance '" + server.name +
                                     "' is itself distributed (takes pieces); it must take segments");
  }
  if (!(server.caps.flags & CAD_ATTENTION_CAP_SHARED_KV)) {
    fail(CAD_STATUS_UNSUPPORTED, "plugin 'cad': server backend instance '" + server.name +
                                     "' does not support segments that share K/V, which server batches use");
  }
  return server;
}

}  // namespace

CadContext::CadContext(const cad_host_services_v1_t* services, const char* config_json)
    : logger(services, "cad") {
  plugin::ConfigReader reader(config_json, "plugin 'cad' config");
  config.communicator = required_name(reader, "communicator");
  config.plan_communicator = reader.get_string("plan_communicator", "");
  config.balancer = required_name(reader, "balancer");
  config.server_backend = required_name(reader, "server_backend");
  config.own_server_backend = reader.get_string("own_server_backend", "");
  config.keep_forward_tensors = reader.get_bool("keep_forward_tensors", true);
  config.comm_stream_highest_priority =
      reader.get_choice("comm_stream_priority", "highest", {"highest", "normal"}) == "highest";
  config.own_tasks_in_place = reader.get_bool("own_tasks_in_place", false);
  config.head_groups = static_cast<int32_t>(reader.get_int("head_groups", 1, 1, 64));
  config.knobs.min_shard_tokens = reader.get_int("min_shard_tokens", 0, 0, std::numeric_limits<int32_t>::max());
  config.knobs.memory_cap_bytes = reader.get_int("memory_cap_bytes", 0, 0, std::numeric_limits<int64_t>::max());
  reader.finish(logger);

  void* instance = nullptr;
  const auto* comm_table = static_cast<const cad_communicator_v1_t*>(
      lookup(services, config.communicator, CAD_PLUGIN_KIND_COMMUNICATOR, &instance));
  comm = std::make_unique<Comm>(comm_table, instance, config.communicator);
  if (!config.plan_communicator.empty()) {
    if (config.plan_communicator == config.communicator) {
      fail(CAD_STATUS_INVALID_CONFIG,
           format("plugin 'cad' config: 'plan_communicator' names '%s', the data communicator itself; it must be an "
                  "instance of its own (or be left out)", config.plan_communicator.c_str()));
    }
    void* plan_instance = nullptr;
    const auto* plan_table = static_cast<const cad_communicator_v1_t*>(
        lookup(services, config.plan_communicator, CAD_PLUGIN_KIND_COMMUNICATOR, &plan_instance));
    plan_comm = std::make_unique<Comm>(plan_table, plan_instance, config.plan_communicator);
    if (plan_comm->rank() != comm->rank() || plan_comm->world() != comm->world()) {
      fail(CAD_STATUS_INVALID_CONFIG,
           format("plugin 'cad' config: plan_communicator '%s' is rank %d of %d but communicator '%s' is rank %d of "
                  "%d; both must span the same ranks in the same order", config.plan_communicator.c_str(),
                  plan_comm->rank(), plan_comm->world(), config.communicator.c_str(), comm->rank(), comm->world()));
    }
  }

  balancer.table = static_cast<const cad_balancer_v1_t*>(
      lookup(services, config.balancer, CAD_PLUGIN_KIND_BALANCER, &balancer.instance));
  balancer.name = config.balancer;
  if (balancer.table->plan == nullptr || balancer.table->release_plan == nullptr ||
      balancer.table->last_error == nullptr) {
    fail(CAD_STATUS_ABI_MISMATCH, "plugin 'cad': balancer instance '" + balancer.name + "' lacks plan functions");
  }

  server = borrow_server_backend(services, config.server_backend);
  own_server = server;
  if (!config.own_server_backend.empty()) {
    own_server = borrow_server_backend(services, config.own_server_backend);
    const cad_attention_capabilities_v1_t& a = server.caps;
    const cad_attention_capabilities_v1_t& b = own_server.caps;
    if (a.device_type != b.device_type || a.dtype_mask != b.dtype_mask || a.flags != b.flags ||
        a.max_head_dim != b.max_head_dim || server.has_plans() != own_server.has_plans()) {
      fail(CAD_STATUS_INVALID_CONFIG,
           "plugin 'cad' config: 'own_server_backend' names '" + own_server.name + "', whose capabilities or plans "
           "differ from the server backend '" + server.name + "'s; it must be an instance of the same kind (e.g. the "
           "same plugin with another 'reserve_sms')");
    }
  }
  // Where the data path runs follows the server backend: CPU tensors with a CPU backend; CUDA tensors
  // with a CUDA backend, over a CUDA communicator (NCCL) or staged through pinned host memory over a
  // CPU one (MPI).
  const cad_device_type_t comm_device = comm->device().device_type;
  if (server.caps.device_type == CAD_DEVICE_CUDA) {
    if (!device_path_available()) {
      fail(CAD_STATUS_UNSUPPORTED, "plugin 'cad': server backend instance '" + server.name +
                                       "' runs on CUDA, but this build of CAD has no CUDA data path (CAD_ENABLE_CUDA=OFF)");
    }
    host_staged = comm_device == CAD_DEVICE_CPU;
  } else if (server.caps.device_type != CAD_DEVICE_CPU) {
    fail(CAD_STATUS_UNSUPPORTED, format("plugin 'cad': server backend instance '%s' runs on device type %d; CAD moves "
                                        "CPU and CUDA tensors", server.name.c_str(), server.caps.device_type));
  } else if (comm_device != CAD_DEVICE_CPU) {
    fail(CAD_STATUS_UNSUPPORTED, format("plugin 'cad': communicator instance '%s' moves device memory but server backend "
                                        "instance '%s' runs on the CPU; pair a CPU backend with a CPU communicator (mpi)",
                                        config.communicator.c_str(), server.name.c_str()));
  }
  accepts.device_type = server.caps.device_type;
  accepts.dtype_mask = server.caps.dtype_mask & (CAD_ATTENTION_DTYPE_FP32 | CAD_ATTENTION_DTYPE_BF16);
  accepts.flags = server.caps.flags;
  accepts.max_head_dim = server.caps.max_head_dim;
  // One line per job is enough at info level; the other ranks say it at debug level.
  const std::string summary =
      format("rank %d of %d: communicator '%s'%s%s, balancer '%s', server backend '%s', keep_forward_tensors %s, %s data "
             "path%s",
             comm->rank(), comm->world(), config.communicator.c_str(), plan_comm ? ", plans over '" : "",
             plan_comm ? (config.plan_communicator + "'").c_str() : "", config.balancer.c_str(),
             config.server_backend.c_str(), config.keep_forward_tensors ? "true" : "false",
             accepts.device_type == CAD_DEVICE_CPU ? "CPU" : (host_staged ? "CUDA (host-staged)" : "CUDA"),
             config.head_groups == 1 ? ""
             : accepts.device_type == CAD_DEVICE_CUDA && !host_staged
                 ? format(", %d head groups", config.head_groups).c_str()
                 : ", head_groups ignored (only the NCCL data path pipelines head groups)");
  logger.log(comm->rank() == 0 ? CAD_LOG_INFO : CAD_LOG_DEBUG, summary);
}

cad_attention_capabilities_v1_t cad_capabilities(const CadContext& ctx) {
  cad_attention_capabilities_v1_t caps{};
  caps.struct_size = sizeof(caps);
  caps.device_type = ctx.accepts.device_type;
  caps.dtype_mask = ctx.accepts.dtype_mask;
  // Windows pass through as the server computes them (CAD itself: causal windows only, validate.cpp).
  caps.flags = CAD_ATTENTION_CAP_PIECES |
               (ctx.server.caps.flags & (CAD_ATTENTION_CAP_CAUSAL | CAD_ATTENTION_CAP_NONCAUSAL |
                                         CAD_ATTENTION_CAP_GQA | CAD_ATTENTION_CAP_BACKWARD | CAD_ATTENTION_CAP_WINDOW));
  caps.head_dim_mask = ctx.server.caps.head_dim_mask;
  caps.max_head_dim = ctx.server.caps.max_head_dim;
  caps.min_compute_capability = ctx.server.caps.min_compute_capability;
  return caps;
}

}  // namespace cad::cad_plugin
