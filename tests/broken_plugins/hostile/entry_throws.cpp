// The entry function lets a C++ exception escape.
#include <stdexcept>

#include "cad_plugin_v1.h"

extern "C" CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) {
  throw std::runtime_error("entry threw on purpose");
}
