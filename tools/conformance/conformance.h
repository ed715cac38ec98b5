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

// A plugin instance the caller created beforehand (e.g. a communicator a CAD backend looks up);
// every runner registers these in the TestServices it lends the plugin under test.
struct HelperInstance {
  std::string name;
  cad_plugin_kind_t kind = 0;
  const void* table = nullptr;  // the kind table
  void* instance = nullptr;
};

struct Options {
  std::string plugin_path;   // the .so under test (already loaded by the caller)
  std::string config_json = "{}";  // config passed to create for the "good config" checks
  uint64_t seed = 1234;      // random batches are drawn from this seed
  bool quick = false;        // fewer/smaller random cases (CI under sanitizers)
  bool verbose = false;      // print every check, not only failures
  std::vector<HelperInstance> instances;  // looked up by name through services->lookup_plugin
};

struct Check {
  std::string name;    // e.g. "forward.gqa.bf16"
  bool passed = false;
  std::string detail;  // why it failed, or a short measurement when it passed
  bool skipped = false;  // not run (passed stays true); detail says why
};

struct Report {
  std::vector<Check> checks;
  void pass(const std::string& name, const std::string& detail = "");
  void fail(const std::string& name, const std::string& detail);
  // A check that could not run here (e.g. a CUDA backend in a kit built without CUDA).
  void skip(const std::string& name, const std::string& reason);
  // Adds a check that passes iff `ok`.
  bool expect(bool ok, const std::string& name, const std::string& detail_if_failed);
  int failed() const;
  int skipped() const;
  int passed() const;  // passed and not skipped
};

// A services table for tests: logs to stderr at >= `level`, allocates with aligned malloc (CPU; CUDA
// through cudaMalloc only in a kit built with CUDA, otherwise refused with UNSUPPORTED) and reports
// leaks (bytes still allocated) through outstanding_bytes(). lookup_plugin finds nothing unless
// instances were registered with add_instance. It lends the ABI v1.1 host collectives for a world of one
// rank (this process; bootstrap_rank 0 of 1, no bootstrap_all_gather), so a communicator that forwards to
// them (plugin "host") is checked like any other. A NULL host_ctx is refused, never dereferenced.
// Thread-safe, as the ABI requires.
class TestServices {
 public:
  explicit TestServices(cad_log_level_t level = CAD_LOG_WARN);
  ~TestServices();
  TestServices(const TestServices&) = delete;
  TestServices& operator=(const TestServices&) = delete;
  const cad_host_services_v1_t* table() const { return &table_; }
  int64_t outstanding_bytes() const;
  void add_instance(const std::string& name, cad_plugin_kind_t kind, const void* table, void* instance);
  void add_instances(const std::vector<HelperInstance>& instances);

  struct State;  // opaque; defined in test_services.cpp (public only so its C callbacks can reach it)

 private:
  State* state_;
  cad_host_services_v1_t table_;
};

// The plugin-level checks every kind shares: table sizes, versions, name, create/destroy with good
// and bad configs, last_error behaviour. Returns false when the table is unusable (the kind's runner
// must not be called then). The two-argument form uses default Options ("{}" config).
bool check_plugin_table(const cad_plugin_v1_t* plugin, const Options& options, Report& report);
void check_plugin_table(const cad_plugin_v1_t* plugin, Report& report);

// One runner per kind (each in its own file).
void run_attention_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report);
void run_communicator_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report);
void run_balancer_conformance(const cad_plugin_v1_t* plugin, const Options& options, Report& report);

}  // namespace cad::conformance
