/* An attention table whose mandatory `forward` slot is NULL. */
#include "stub_attention.h"

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, NULL);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 1, "null_function", &attention);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
