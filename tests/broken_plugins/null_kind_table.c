/* Says it is an attention plugin but lends no attention table. */
#include "stub_attention.h"

static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 1, "null_kind_table", NULL);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
