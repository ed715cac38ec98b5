// A C++ static initialiser that throws while the plugin is being loaded. The exception leaves the
// dynamic loader through its own frames (see cad_host.h, cad_library_open, on what that does).
#include <stdexcept>

#include "cad_plugin_v1.h"

namespace {
struct ThrowsOnLoad {
  ThrowsOnLoad() { throw std::runtime_error("static initialiser threw on purpose"); }
};
const ThrowsOnLoad throws_on_load;
}  // namespace

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return nullptr; }
