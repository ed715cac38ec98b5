/* A plain shared library that happens to define cad_plugin_entry_v1 (linked by entry_in_dependency.c):
 * the host must not accept a plugin whose entry symbol is found only here. */
#include "stub_attention.h"

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 1, "helper", &attention);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
CAD_PLUGIN_EXPORT int cad_broken_helper_answer(void) { return 42; }
