/* Needs a symbol nobody defines (a data reference, so the loader resolves it at load time): the
 * dynamic loader itself refuses it, and the host must pass the loader's reason on. */
#include "stub_attention.h"

extern int cad_missing_variable;

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 1, "undefined_symbol", &attention);

CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return cad_missing_variable ? &plugin : NULL; }
