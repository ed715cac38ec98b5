// fuzz_config.cpp -- the JSON config readers: the host's stack config (host_adapter/src/host_config.cpp)
// and the plugins' ConfigReader (plugins/common/plugin_support.cpp), both over json_guard. Any input
// must end in a value or in the reader's own error type with a message naming the source -- never a
// crash, a stack overflow, or another exception type (which the C boundary reported as INTERNAL).
#include <string>

#include "fuzz_input.h"
#include "host_config.h"
#include "host_error.h"
#include "plugin_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const cad::host::HostConfig config = cad::host::parse_host_config(text, "fuzz.json", "/nonexistent");
    if (config.instances.empty()) cad::fuzz::broken("a stack config without instances accepted");
  } catch (const cad::host::HostError& e) {
    if (std::string(e.what()).rfind("fuzz.json: ", 0) != 0) cad::fuzz::broken("a config error not naming the file");
  }
  try {
    cad::plugin::ConfigReader reader(text.c_str(), "plugin 'fuzz' config");
    reader.get_int("timeout_ms", 1, 1, 1000);
    reader.get_double("tolerance", 0.1, 0.0, 1.0);
    reader.get_bool("verify_counts", true);
    reader.get_choice("mode", "a", {"a", "b"});
    reader.get_json("ranks").dump();
  } catch (const cad::plugin::Failure& f) {
    if (f.status() != CAD_STATUS_INVALID_CONFIG) cad::fuzz::broken("a plugin config refused with another status");
  }
  return 0;
}
