/*
 * cad_host.h -- the host adapter's C API: what a trainer links to load CAD plugins and build the
 * configured plugin stack. (Plugins never include this; they see only plugin_api/.)
 *
 * Errors: every function returning cad_status_t writes a one-line, NUL-terminated message into
 * `error` (capacity `error_capacity`, may be 0/NULL) on failure and leaves its outputs untouched.
 * Threading: a cad_library_t / cad_host_t may be used from one thread at a time; the services table a
 * host lends its plugins is thread-safe.
 */
#ifndef CAD_HOST_H
#define CAD_HOST_H

#include "cad_plugin_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- One plugin shared object ---------------------------------------------------------------- */
typedef struct cad_library cad_library_t;

/* Open a plugin by path (contains '/' or ends in ".so") or by name: "NAME" is looked up as
 * cad_NAME.so in `search_path` (colon-separated; NULL = $CAD_PLUGIN_PATH, then the build/install
 * plugin directory). Loads with local symbol scope, checks that the entry symbol is the object's own,
 * that the ABI major matches, and the tables' sizes. On success *out owns the loaded object. */
cad_status_t cad_library_open(const char* name_or_path, const char* search_path, cad_library_t** out,
                              char* error, size_t error_capacity);
const cad_plugin_v1_t* cad_library_plugin(const cad_library_t* library); /* borrowed, static data */
const char* cad_library_path(const cad_library_t* library);              /* resolved absolute path */
void cad_library_close(cad_library_t* library);                          /* NULL is a no-op */

/* Every plugin file found on the search path (sorted by file name), as resolved paths joined by '\n'.
 * The returned string is owned by the caller and released with cad_string_free. */
cad_status_t cad_list_plugin_files(const char* search_path, char** out_paths, char* error,
                                   size_t error_capacity);
void cad_string_free(char* s);

/* ---- The configured stack -------------------------------------------------------------------- */
typedef struct cad_host cad_host_t;

/* Out-of-band all-gather for bootstrapping communicators (see cad_host_services_v1_t). */
typedef cad_status_t (*cad_bootstrap_all_gather_fn)(void* user, const void* send, size_t bytes, void* recv);

typedef struct cad_host_options_v1 {
  size_t struct_size;
  const char* config_json;  /* the stack config as JSON text, or NULL to read config_path             */
  const char* config_path;  /* a JSON file; also names the source in error messages                   */
  const char* search_path;  /* overrides the config's "plugin_path" and $CAD_PLUGIN_PATH if non-NULL  */
  cad_bootstrap_all_gather_fn bootstrap_all_gather; /* may be NULL                                    */
  void* bootstrap_user;
  int32_t bootstrap_rank;
  int32_t bootstrap_world_size;
} cad_host_options_v1_t;

/* Validate the config, load every plugin it names and create every instance in order (an instance may
 * look up only instances listed before it). On failure nothing stays loaded. */
cad_status_t cad_host_create(const cad_host_options_v1_t* options, cad_host_t** out, char* error,
                             size_t error_capacity);
/* Destroys instances in reverse creation order, then unloads the plugins. NULL is a no-op. */
void cad_host_destroy(cad_host_t* host);

/* The services table the host lends its plugins (valid until cad_host_destroy). */
const cad_host_services_v1_t* cad_host_services(cad_host_t* host);

/* Find a created instance by name and kind; *out_table is the kind's table. */
cad_status_t cad_host_find_instance(cad_host_t* host, const char* instance_name, cad_plugin_kind_t kind,
                                    const void** out_table, void** out_instance);

/* The instance named by the config's "attention" key: the one the trainer calls. */
cad_status_t cad_host_attention(cad_host_t* host, const cad_attention_v1_t** out_table, void** out_instance);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_HOST_H */
