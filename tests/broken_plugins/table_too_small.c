/* A plugin table whose struct_size is smaller than ABI v1's table (as if built from a truncated header). */
#include "stub_attention.h"

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(24, 1, "table_too_small", &attention);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
