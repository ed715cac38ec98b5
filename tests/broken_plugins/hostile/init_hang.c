/* Never returns from a static initialiser. */
#include <unistd.h>

#include "../stub_attention.h"

__attribute__((constructor)) static void hang_while_loading(void) {
  for (;;) pause();
}

static const cad_attention_v1_t attention = STUB_ATTENTION_TABLE(stub_create, stub_forward);
static const cad_plugin_v1_t plugin = STUB_PLUGIN_TABLE(sizeof(cad_plugin_v1_t), 1, "init_hang", &attention);
CAD_PLUGIN_EXPORT const cad_plugin_v1_t* cad_plugin_entry_v1(void) { return &plugin; }
