/* A well-formed plugin whose name and description are not UTF-8. */
#include "../stub_attention.h"

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = {sizeof(cad_plugin_v1_t), 1, CAD_ABI_VERSION_MINOR, CAD_PLUGIN_KIND_ATTENTION,
                                       "latin1_\xe9t\xe9", "0.0-\xff", "not UTF-8: \xc3\x28 \xfe", &attention, NULL, NULL};
CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
