// conformance.h -- the conformance kit: drives one plugin through the ABI alone and checks its
// contract. One runner per plugin kind, each in its own file; `cad conformance PLUGIN.so` picks the
// runner from the plugin's kind. A runner records every check in a Report; it never throws and never
// aborts the process on a plugin's misbehaviour.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cad_plugin_v1.h"

namespace cad::conformance {

struct Options {
  std::string plugin_path;   // the .so under test (already loaded by the caller)
  std::string config_json = "{}";  // config passed to create for the "good config" checks
  uint64_t seed = 1234;      // random batches are drawn from this seed
  bool quick = false;        // fewer/smaller random cases (CI under sanitizers)
  bool verbose = false;      // print every check, not only failures
};

struct Check {
  std::string name;    // e.g. "forward.gqa.bf16"
  bool passed = false;
  std::string detail;  // why it failed, or a short measurement when it passed
};

struct Report {
  std::vector<Check> checks;
  void pass(const std::string& name, const std::string& detail = "");
  void fail(const std::string& name, const std::string& detail);
  // Adds a check that passes iff `ok`.
  bool expect(bool ok, const std::string& name, const std::string& detail_if_failed);
  int failed() const;
};

// A services table for tests: logs to stderr at >= `level`, allocates with aligned malloc (CPU) and
// reports leaks (bytes still allocated) through outstanding_bytes(). lookup_plugin finds nothing
// unless instances were registered with add_instance.
class TestServices {
 public:
  explicit TestServices(cad_log_level_t level = CAD_LOG_WARN);
  ~TestServices();
  TestServices(const TestServices&) = delete;
  TestServices& operator=(const TestServices&) = delete;
  const cad_host_services_v1_t* table() const { return &table_; }
  int64_t outstanding_bytes() const;
  void add_instance(const std::string& name, cad_plugin_kind_t kind, const void* table, void* instance);

 private:
  struct State;
  State* state_;
  cad_host_services_v1_t table_;
};

// The plugin-level checks every kind shares: table sizes, versions, name, create/destroy with good
// and bad configs, last_error behaviour.
void check_plugin_table(const cad_plugin_v1_t* plugin, Report& report);

// One runner per kind (each in its own file).
void run_attention_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report);
void run_communicator_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report);
void run_balancer_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report);

}  // namespace cad::conformance
