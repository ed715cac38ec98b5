// cmd_conformance.cpp -- `cad conformance PLUGIN`: loads one plugin through the host loader and runs
// the conformance kit on it (the shared table checks, then the runner of the plugin's kind).
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cad_host.h"
#include "cli_args.h"
#include "command.h"
#include "plugin_probe.h"
#include "conformance.h"

namespace {

const char* kUsage =
    "usage: cad conformance PLUGIN.so|NAME [--config JSON] [--seed N] [--quick] [--verbose]\n"
    "                       [--instances JSON]\n\n"
    "Drives one plugin through the plugin ABI alone and checks its contract: the entry table, create\n"
    "and destroy with good and bad configs, error buffers and last_error; then, per kind, attention\n"
    "numerics against the kit's fp64 oracle plus refusals and argument errors, balancer plan validity\n"
    "and determinism plus refusals, or the communicator's collectives (run those under mpirun).\n"
    "Prints one line per failed or skipped check and a summary; exits 0 only if no check failed, 4 if\n"
    "the plugin cannot be tested on this machine (its create reports no usable device, e.g. the cuda\n"
    "backend without a GPU). The plugin is first loaded in a child process: one that crashes, hangs or\n"
    "exits while loading is reported as broken (exit 1).\n\n"
    "  --config JSON     config for create (default {}); its keys also drive the wrong-type checks\n"
    "  --seed N          seed of the random batches (default 1234)\n"
    "  --quick           fewer random cases (for sanitizer builds)\n"
    "  --verbose         print every check, not only failures\n"
    "  --instances JSON  helper instances the plugin may look up, created before it:\n"
    "                    [{\"name\": \"comm\", \"plugin\": \"mpi\", \"config\": {...}}, ...]\n";

using cad::conformance::HelperInstance;

// Communicator libraries stay loaded until the process exits: an MPI or NCCL runtime keeps
// process-wide state after its last instance (MPI cannot even be initialised twice), and unloading it
// would also leave its exit-time allocations unattributable for LeakSanitizer's suppressions.
void close_library(cad_library_t* library) {
  // Never destroyed (static destructors run before LeakSanitizer looks), so the handles stay reachable.
  static auto* kept_until_exit = new std::vector<cad_library_t*>();
  if (cad_library_plugin(library)->kind == CAD_PLUGIN_KIND_COMMUNICATOR) {
    kept_until_exit->push_back(library);
  } else {
    cad_library_close(library);
  }
}

// Helper instances: their libraries stay loaded and their contexts alive for the whole run.
class Helpers {
 public:
  ~Helpers() {
    for (size_t i = contexts_.size(); i-- > 0;) contexts_[i].destroy(contexts_[i].ctx);
    for (cad_library_t* library : libraries_) close_library(library);
  }

  // Creates every instance described by `json`; on failure returns false with *error set.
  bool create(const std::string& json, std::vector<HelperInstance>* out, std::string* error) {
    nlohmann::json list;
    try {
      list = nlohmann::json::parse(json);
    } catch (const nlohmann::json::exception& e) {
      *error = std::string("--instances: not valid JSON: ") + e.what();
      return false;
    }
    if (!list.is_array()) {
      *error = "--instances: expected a JSON array of {\"name\", \"plugin\", \"config\"} objects";
      return false;
    }
    for (size_t i = 0; i < list.size(); ++i) {
      const nlohmann::json& item = list[i];
      const std::string where = "--instances[" + std::to_string(i) + "]";
      if (!item.is_object() || !item.contains("name") || !item["name"].is_string() || !item.contains("plugin") ||
          !item["plugin"].is_string()) {
        *error = where + ": expected an object with string keys \"name\" and \"plugin\"";
        return false;
      }
      const std::string config = item.contains("config") ? item["config"].dump() : "{}";
      if (!create_one(item["name"].get<std::string>(), item["plugin"].get<std::string>(), config, where, out, error)) {
        return false;
      }
    }
    return true;
  }

 private:
  struct Live {
    void (*destroy)(void*);
    void* ctx;
  };

  bool create_one(const std::string& name, const std::string& plugin_name, const std::string& config,
                  const std::string& where, std::vector<HelperInstance>* out, std::string* error) {
    char message[2048] = {0};
    cad_library_t* library = nullptr;
    if (cad_library_open(plugin_name.c_str(), nullptr, &library, message, sizeof(message)) != CAD_STATUS_OK) {
      *error = where + ": " + message;
      return false;
    }
    libraries_.push_back(library);
    const cad_plugin_v1_t* plugin = cad_library_plugin(library);
    const void* table = nullptr;
    cad_status_t (*create)(const cad_host_services_v1_t*, const char*, void**, char*, size_t) = nullptr;
    void (*destroy)(void*) = nullptr;
    switch (plugin->kind) {
      case CAD_PLUGIN_KIND_ATTENTION:
        table = plugin->attention, create = plugin->attention->create, destroy = plugin->attention->destroy;
        break;
      case CAD_PLUGIN_KIND_COMMUNICATOR:
        table = plugin->communicator, create = plugin->communicator->create, destroy = plugin->communicator->destroy;
        break;
      case CAD_PLUGIN_KIND_BALANCER:
        table = plugin->balancer, create = plugin->balancer->create, destroy = plugin->balancer->destroy;
        break;
    }
    void* ctx = nullptr;
    if (create == nullptr || create(services_.table(), config.c_str(), &ctx, message, sizeof(message)) != CAD_STATUS_OK) {
      *error = where + ": create failed: " + message;
      return false;
    }
    contexts_.push_back(Live{destroy, ctx});
    services_.add_instance(name, plugin->kind, table, ctx);  // later helpers may look up earlier ones
    out->push_back(HelperInstance{name, plugin->kind, table, ctx});
    return true;
  }

  cad::conformance::TestServices services_;
  std::vector<cad_library_t*> libraries_;
  std::vector<Live> contexts_;
};

void print_report(const cad::conformance::Report& report, bool verbose) {
  for (const auto& check : report.checks) {
    if (!check.passed) {
      std::printf("FAIL %s: %s\n", check.name.c_str(), check.detail.c_str());
    } else if (check.skipped) {
      // Always shown: a skipped check is work someone still has to do elsewhere.
      const std::string reason = check.detail.substr(check.detail.rfind("skipped: ", 0) == 0 ? 9 : 0);
      std::printf("SKIP %s: %s\n", check.name.c_str(), reason.c_str());
    } else if (verbose) {
      std::printf("ok   %s%s%s\n", check.name.c_str(), check.detail.empty() ? "" : ": ", check.detail.c_str());
    }
  }
  std::printf("conformance: %d passed, %d failed", report.passed(), report.failed());
  if (report.skipped() > 0) std::printf(", %d skipped", report.skipped());
  std::printf("\n");
}

// Distinct from 1 (failures): the plugin needs a device this machine lacks, so nothing was checked.
constexpr int kExitCannotTestHere = 4;

// Empty, or why an attention plugin cannot run here: its create with the run's config reports
// CAD_STATUS_DEVICE_ERROR (the cuda backend on a machine without a CUDA device). Other outcomes are
// left to the kit, which checks and reports them.
std::string device_missing(const cad_plugin_v1_t* plugin, const cad::conformance::Options& options) {
  if (plugin->kind != CAD_PLUGIN_KIND_ATTENTION || plugin->attention == nullptr ||
      plugin->attention->create == nullptr || plugin->attention->destroy == nullptr) {
    return "";
  }
  cad::conformance::TestServices services;
  services.add_instances(options.instances);
  char message[1024] = {0};
  void* ctx = nullptr;
  cad_status_t status = CAD_STATUS_OK;
  try {
    status = plugin->attention->create(services.table(), options.config_json.c_str(), &ctx, message, sizeof message);
  } catch (...) {
    return "";  // the kit meets the same exception and reports it, naming the plugin
  }
  message[sizeof message - 1] = '\0';
  if (status == CAD_STATUS_OK) {
    if (ctx != nullptr) plugin->attention->destroy(ctx);
    return "";
  }
  return status == CAD_STATUS_DEVICE_ERROR ? std::string("no usable device (create: ") + message + ")" : "";
}

int run_conformance(int argc, char** argv) {
  const cad::cli::Args args(argc, argv, {"--config", "--seed", "--instances"}, {"--quick", "--verbose"});
  if (args.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.positional().size() != 1) throw cad::cli::UsageError("expected exactly one plugin (a .so path or a name)");

  cad::conformance::Options options;
  options.plugin_path = args.positional()[0];
  options.config_json = args.get("--config", "{}");
  options.seed = static_cast<uint64_t>(args.get_int("--seed", 1234, 0, INT64_MAX));
  options.quick = args.has("--quick");
  options.verbose = args.has("--verbose");

  // Load it in a child process first: a plugin that crashes, hangs or exits while loading is reported
  // as broken instead of ending this process (an exit(0) there was a silent false success).
  const cad::cli::ProbeResult probe = cad::cli::probe_plugin(options.plugin_path);
  if (!probe.error.empty()) {
    std::printf("%s\nconformance: the plugin cannot be loaded\n", probe.error.c_str());
    return 1;
  }
  char message[2048] = {0};
  cad_library_t* library = nullptr;
  if (cad_library_open(options.plugin_path.c_str(), nullptr, &library, message, sizeof(message)) != CAD_STATUS_OK) {
    std::printf("%s\n", message);
    return 1;
  }
  const std::unique_ptr<cad_library_t, void (*)(cad_library_t*)> loaded(library, close_library);
  const cad_plugin_v1_t* plugin = cad_library_plugin(library);
  options.plugin_path = cad_library_path(library);

  Helpers helpers;  // declared after `loaded`: helper instances go before the plugin under test unloads
  if (args.has("--instances")) {
    std::string error;
    if (!helpers.create(args.get("--instances", "[]"), &options.instances, &error)) {
      std::printf("%s\n", error.c_str());
      return 1;
    }
  }

  if (const std::string why = device_missing(plugin, options); !why.empty()) {
    std::printf("plugin %s cannot be tested here: %s\nconformance: not run (exit status %d)\n",
                options.plugin_path.c_str(), why.c_str(), kExitCannotTestHere);
    return kExitCannotTestHere;
  }

  cad::conformance::Report report;
  try {
    if (cad::conformance::check_plugin_table(plugin, options, report)) {
      switch (plugin->kind) {
        case CAD_PLUGIN_KIND_ATTENTION: cad::conformance::run_attention_conformance(plugin, options, report); break;
        case CAD_PLUGIN_KIND_COMMUNICATOR: cad::conformance::run_communicator_conformance(plugin, options, report); break;
        case CAD_PLUGIN_KIND_BALANCER: cad::conformance::run_balancer_conformance(plugin, options, report); break;
      }
    }
  } catch (const std::exception& e) {
    throw std::runtime_error("plugin " + options.plugin_path + ": an exception escaped through its C ABI: " + e.what());
  } catch (...) {
    throw std::runtime_error("plugin " + options.plugin_path +
                             ": a non-standard C++ exception escaped through its C ABI (no check can continue)");
  }
  if (options.verbose) {
    std::printf("plugin %s (%s, %s)\n", options.plugin_path.c_str(), plugin->name ? plugin->name : "?",
                cad_plugin_kind_name(plugin->kind));
  }
  print_report(report, options.verbose);
  return report.failed() == 0 ? 0 : 1;
}

}  // namespace

CAD_REGISTER_COMMAND_IN_CHILD(conformance, "conformance", "check that a plugin honours the plugin ABI contract", run_conformance);
