/* Exports only the entry symbol of a future ABI major (v2), as a plugin built against ABI 2 would. */
#include "stub_attention.h"

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 2, "wrong_major", &attention);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v2(void) { return &plugin; }
