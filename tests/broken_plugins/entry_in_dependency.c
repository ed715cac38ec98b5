/* Defines no entry symbol itself, but links a library that does (entry_helper.c): dlsym on this
 * object's handle finds the helper's cad_plugin_entry_v1. */
int cad_broken_helper_answer(void);

__attribute__((visibility("default"))) int cad_uses_helper(void) { return cad_broken_helper_answer(); }
