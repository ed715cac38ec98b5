/* Exports the v1 entry symbol, but its table says it was built for ABI major 2. */
#include "stub_attention.h"

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 2, "table_major2", &attention);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
