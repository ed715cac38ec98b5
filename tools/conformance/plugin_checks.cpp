// plugin_checks.cpp -- the checks every plugin kind shares: the entry table, then create/destroy and
// last_error behaviour with good and bad configs (see conformance.h).
#include <cstring>

#include <nlohmann/json.hpp>

#include "kit_internal.h"

namespace cad::conformance {

namespace {

constexpr unsigned char kCanary = 0xA5;
// A value no plugin returns as a context: create must leave *out_ctx untouched on failure.
void* const kUntouchedCtx = reinterpret_cast<void*>(uintptr_t{0x5eed});

bool valid_name(const char* name) {
  if (name == nullptr || name[0] == '\0') return false;
  for (const char* p = name; *p != '\0'; ++p) {
    const char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

// The first part of the checks: is the table something a host can use at all?
bool check_table(const cad_plugin_v1_t* plugin, Report& report) {
  if (!report.expect(plugin != nullptr, "table.entry", "cad_plugin_entry_v1 returned NULL")) return false;
  if (!report.expect(plugin->struct_size >= sizeof(cad_plugin_v1_t), "table.struct_size",
                     "struct_size " + std::to_string(plugin->struct_size) + " < " +
                         std::to_string(sizeof(cad_plugin_v1_t)) + " (what ABI v1.0 needs)")) {
    return false;
  }
  if (!report.expect(plugin->abi_major == CAD_ABI_VERSION_MAJOR, "table.abi_major",
                     "abi_major is " + std::to_string(plugin->abi_major) + ", expected 1")) {
    return false;
  }
  const int tables = (plugin->attention != nullptr) + (plugin->communicator != nullptr) + (plugin->balancer != nullptr);
  const void* own = plugin->kind == CAD_PLUGIN_KIND_ATTENTION      ? static_cast<const void*>(plugin->attention)
                    : plugin->kind == CAD_PLUGIN_KIND_COMMUNICATOR ? static_cast<const void*>(plugin->communicator)
                    : plugin->kind == CAD_PLUGIN_KIND_BALANCER     ? static_cast<const void*>(plugin->balancer)
                                                                   : nullptr;
  if (!report.expect(own != nullptr && tables == 1, "table.kind",
                     "kind " + std::to_string(plugin->kind) + " with " + std::to_string(tables) +
                         " kind tables set; expected a valid kind and exactly its own table non-NULL")) {
    return false;
  }
  report.expect(valid_name(plugin->name), "table.name",
                std::string("name ") + (plugin->name ? "'" + std::string(plugin->name) + "'" : "NULL") +
                    " does not match [a-z0-9_]+");
  report.expect(plugin->version != nullptr && plugin->description != nullptr, "table.strings",
                "version and description must be non-NULL");

  size_t have = 0, need = 0;
  bool functions = false;
  switch (plugin->kind) {
    case CAD_PLUGIN_KIND_ATTENTION: {
      const cad_attention_v1_t* t = plugin->attention;
      have = t->struct_size;
      need = CAD_ATTENTION_V1_0_TABLE_SIZE;  // the v1.1 plan slots are optional
      functions = have >= need && t->create && t->destroy && t->last_error && t->get_capabilities && t->forward &&
                  t->backward;  // get_stats_json is optional
      break;
    }
    case CAD_PLUGIN_KIND_COMMUNICATOR: {
      const cad_communicator_v1_t* t = plugin->communicator;
      have = t->struct_size;
      need = sizeof(cad_communicator_v1_t);
      functions = have >= need && t->create && t->destroy && t->last_error && t->get_rank && t->get_world_size &&
                  t->get_device && t->all_to_all_v && t->all_gather && t->barrier;
      break;
    }
    case CAD_PLUGIN_KIND_BALANCER: {
      const cad_balancer_v1_t* t = plugin->balancer;
      have = t->struct_size;
      need = sizeof(cad_balancer_v1_t);
      functions = have >= need && t->create && t->destroy && t->last_error && t->plan && t->release_plan;
      break;
    }
  }
  if (!report.expect(have >= need, "table.kind_struct_size",
                     "kind table struct_size " + std::to_string(have) + " < " + std::to_string(need))) {
    return false;
  }
  return report.expect(functions, "table.functions", "a mandatory function pointer of the kind table is NULL");
}

// Create with `config`, expecting failure with `want` (or any non-OK when want == OK). Checks the
// message in the error buffer and that *out_ctx stayed untouched.
void expect_refused_config(const Lifecycle& life, const TestServices& services, const char* config,
                           cad_status_t want, const std::string& check, Report& report) {
  char message[256];
  std::memset(message, kCanary, sizeof(message));
  void* ctx = kUntouchedCtx;
  const cad_status_t status = life.create(services.table(), config, &ctx, message, sizeof(message));
  if (status == CAD_STATUS_OK) {
    if (ctx != kUntouchedCtx && ctx != nullptr) life.destroy(ctx);
    report.fail(check, std::string("create accepted config ") + config);
    return;
  }
  const bool terminated = std::memchr(message, '\0', sizeof(message)) != nullptr;
  std::string problem;
  if (want != CAD_STATUS_OK && status != want) problem += "returned " + status_name(status) + ", expected " + status_name(want) + "; ";
  if (!terminated) problem += "error message not NUL-terminated; ";
  else if (message[0] == '\0') problem += "empty error message; ";
  if (ctx != kUntouchedCtx) problem += "*out_ctx was modified on failure; ";
  report.expect(problem.empty(), check, problem + "config " + config);
}

// Configs with each key of the given config replaced by a value of another JSON type.
void check_wrong_types(const Lifecycle& life, const TestServices& services, const std::string& config,
                       Report& report) {
  nlohmann::json good;
  try {
    good = nlohmann::json::parse(config);
  } catch (const nlohmann::json::exception&) {
    report.fail("config.given_is_json", "the --config given to the kit is not JSON: " + config);
    return;
  }
  if (!good.is_object()) return;
  for (const auto& item : good.items()) {
    nlohmann::json bad = good;
    // A string where a number/bool/object was expected; a nested object where a string was expected.
    bad[item.key()] = item.value().is_string() ? nlohmann::json::object({{"wrong", "type"}}) : nlohmann::json("many");
    expect_refused_config(life, services, bad.dump().c_str(), CAD_STATUS_OK, "config.wrong_type." + item.key(), report);
  }
}

void check_error_buffers(const Lifecycle& life, const TestServices& services, Report& report) {
  unsigned char buffer[16];
  std::memset(buffer, kCanary, sizeof(buffer));
  void* ctx = kUntouchedCtx;
  cad_status_t status = CAD_STATUS_INTERNAL;
  // A plugin that accepts "not json" already failed config.not_json; keep its contexts from leaking.
  // Only a create that returned OK made a context: after a failed one, whatever it left in *out_ctx
  // is not a context (destroying it would crash the kit; error_buffer.null reports the write).
  const auto forget = [&] {
    if (status == CAD_STATUS_OK && ctx != kUntouchedCtx && ctx != nullptr) life.destroy(ctx);
  };
  status = life.create(services.table(), "not json", &ctx, reinterpret_cast<char*>(buffer), 1);
  forget();
  bool intact = buffer[0] == '\0';
  for (size_t i = 1; i < sizeof(buffer); ++i) intact = intact && buffer[i] == kCanary;
  report.expect(intact, "error_buffer.capacity_1",
                "with error_capacity 1 the plugin must write exactly one NUL and nothing beyond");

  std::memset(buffer, kCanary, sizeof(buffer));
  ctx = kUntouchedCtx;
  status = life.create(services.table(), "not json", &ctx, reinterpret_cast<char*>(buffer), 0);
  forget();
  intact = true;
  for (size_t i = 0; i < sizeof(buffer); ++i) intact = intact && buffer[i] == kCanary;
  report.expect(intact, "error_buffer.capacity_0", "with error_capacity 0 the plugin wrote into the buffer");

  ctx = kUntouchedCtx;
  status = life.create(services.table(), "not json", &ctx, nullptr, 0);  // must not crash
  report.expect(ctx == kUntouchedCtx, "error_buffer.null", "a failed create modified *out_ctx");
  forget();
}

void check_lifecycle(const cad_plugin_v1_t* plugin, const Options& options, Report& report) {
  Lifecycle life;
  lifecycle_of(plugin, &life);
  TestServices services;
  services.add_instances(options.instances);

  life.destroy(nullptr);
  report.pass("destroy.null");

  // The default config and NULL (documented as "defaults") must both work, or be refused with
  // INVALID_CONFIG / NOT_FOUND and a message by a plugin that has required keys.
  for (const char* config : {"{}", static_cast<const char*>(nullptr)}) {
    const std::string check = config ? "create.default_config" : "create.null_config";
    char message[512] = {0};
    void* ctx = nullptr;
    const cad_status_t status = life.create(services.table(), config, &ctx, message, sizeof(message));
    if (status == CAD_STATUS_OK) {
      const char* error = ctx ? life.last_error(ctx) : nullptr;
      report.expect(ctx != nullptr, check, "create returned OK and a NULL context");
      if (ctx == nullptr) continue;
      report.expect(error != nullptr, "last_error.fresh" + std::string(config ? "" : ".null_config"),
                    "last_error returned NULL on a fresh context");
      life.destroy(ctx);
    } else if ((status == CAD_STATUS_INVALID_CONFIG || status == CAD_STATUS_NOT_FOUND) && message[0] != '\0') {
      // A plugin with required keys (e.g. the names of the instances it looks up) has no defaults;
      // refusing them with a message is the contract. The given config must then work (the runner
      // creates its instance with it).
      report.pass(check, "refused (the plugin requires config): " + std::string(message));
    } else {
      report.fail(check, "returned " + status_name(status) + ": " + message);
    }
  }

  if (options.config_json != "{}") {
    char message[512] = {0};
    void* ctx = nullptr;
    const cad_status_t status =
        life.create(services.table(), options.config_json.c_str(), &ctx, message, sizeof(message));
    report.expect(status == CAD_STATUS_OK && ctx != nullptr, "create.given_config",
                  "config " + options.config_json + " returned " + status_name(status) + ": " + message);
    if (status == CAD_STATUS_OK && ctx != nullptr) life.destroy(ctx);
    check_wrong_types(life, services, options.config_json, report);
  }

  expect_refused_config(life, services, "not json", CAD_STATUS_INVALID_CONFIG, "config.not_json", report);
  expect_refused_config(life, services, "[1,2]", CAD_STATUS_INVALID_CONFIG, "config.not_object", report);
  expect_refused_config(life, services, "{\"a\": ", CAD_STATUS_INVALID_CONFIG, "config.truncated", report);

  {
    char message[256];
    std::memset(message, kCanary, sizeof(message));
    const cad_status_t status = life.create(services.table(), options.config_json.c_str(), nullptr, message,
                                            sizeof(message));
    report.expect(status != CAD_STATUS_OK && message[0] != '\0' && std::memchr(message, '\0', sizeof(message)),
                  "create.null_out_ctx",
                  "create with out_ctx NULL returned " + status_name(status) + " (expected a refusal with a message)");
  }

  check_error_buffers(life, services, report);
  report.expect(services.outstanding_bytes() == 0, "create.no_leak",
                std::to_string(services.outstanding_bytes()) + " bytes of host allocations not freed after destroy");
}

}  // namespace

bool check_plugin_table(const cad_plugin_v1_t* plugin, const Options& options, Report& report) {
  if (!check_table(plugin, report)) return false;
  check_lifecycle(plugin, options, report);
  return true;
}

void check_plugin_table(const cad_plugin_v1_t* plugin, Report& report) {
  check_plugin_table(plugin, Options{}, report);
}

}  // namespace cad::conformance
