// kit_internal.h -- helpers the kit's runners share (not part of the kit's public API).
#pragma once

#include <memory>
#include <string>

#include "conformance.h"

namespace cad::conformance {

// The three functions every kind table starts with, seen the same way for every kind.
struct Lifecycle {
  cad_status_t (*create)(const cad_host_services_v1_t*, const char*, void**, char*, size_t) = nullptr;
  void (*destroy)(void*) = nullptr;
  const char* (*last_error)(void*) = nullptr;
};

// The lifecycle functions of the plugin's kind table; false if the kind or its table is unusable.
bool lifecycle_of(const cad_plugin_v1_t* plugin, Lifecycle* out);

// "CAD_STATUS_INVALID_ARGUMENT (1)" etc.
std::string status_name(cad_status_t status);

// last_error(ctx) as a std::string; "<NULL>" if the plugin returned NULL.
std::string last_error_of(const Lifecycle& life, void* ctx);

// True if `message` names `what` quoted ('q' or "q"), as the ABI asks errors to do.
bool names_quoted(const std::string& message, const std::string& what);

// An instance of the plugin under test, destroyed when this goes out of scope.
class Instance {
 public:
  Instance(const Lifecycle& life, void* ctx) : life_(life), ctx_(ctx) {}
  ~Instance() {
    if (ctx_ != nullptr) life_.destroy(ctx_);
  }
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  void* get() const { return ctx_; }

 private:
  Lifecycle life_;
  void* ctx_;
};

// Creates the instance a runner drives, with options.config_json. On success returns it. On failure
// records why in `report` under `check_name` -- as a skip when the plugin only lacks helper instances
// the test host does not have (NOT_FOUND with the default config), as a failure otherwise -- and
// returns nullptr.
std::unique_ptr<Instance> create_for_run(const cad_plugin_v1_t* plugin, const Options& options,
                                         const TestServices& services, const std::string& check_name,
                                         Report& report);

// Relative error of `got` against `want` as the project defines it: max|got-want| / max(max|want|, floor).
double max_relative_error(const double* got, const double* want, size_t n, double floor);

}  // namespace cad::conformance
