/* A shared object that exports something, but no CAD entry symbol. */
#include "cad_plugin_v1.h"

CAD_PLUGIN_EXPORT int cad_not_a_plugin(void) { return 42; }
