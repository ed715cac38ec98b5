/* Calls exit(0) in a static initialiser: the loading process ends "successfully". */
#include "../stub_attention.h"

__attribute__((constructor)) static void exit_while_loading(void) { exit(0); }

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 1, "init_exit0", &attention);
CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
