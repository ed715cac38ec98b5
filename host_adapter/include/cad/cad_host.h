/*
 * cad_host.h -- the host adapter's C API: what a trainer links to load CAD plugins and build the
 * configured plugin stack. (Plugins never include this; they see only plugin_api/.)
 *
 * Errors: every function returning cad_status_t writes a one-line, NUL-terminated message into
 * `error` (capacity `error_capacity`, may be 0/NULL) on failure and leaves its outputs untouched.
 * Threading: a cad_library_t / cad_host_t may be used from one thread at a time; the services table a
 * host lends its plugins is thread-safe.
 *
 * Misuse -- what is checked (returns INVALID_ARGUMENT, or is a no-op, with no crash) and what is
 * undefined behaviour (not checked: checking would cost every call, or cannot be done at all):
 *   cad_library_open        checked: NULL name_or_path/out; missing, non-ELF, truncated files; wrong
 *                           ABI, malformed tables; an entry function that throws; a C++ static
 *                           initialiser that throws (every open first loads the file in a forked child,
 *                           which costs one fork: such an exception would leave glibc's loader lock
 *                           held, after which any dlopen/dlclose in another thread blocks forever; it is
 *                           refused with ABI_MISMATCH, "its static initialiser throws", and nothing is
 *                           loaded here). With CAD_PLUGIN_PROBE=0 in the environment there is no fork
 *                           and no such check (the Python package sets it: a trainer holding GPU memory
 *                           and NCCL threads should not fork); a throwing initialiser is then undefined
 *                           as below. Undefined: a plugin whose static initialiser crashes, hangs or
 *                           calls exit() takes the calling process with it (load it in a child first,
 *                           as `cad plugins` does).
 *   cad_library_plugin/_path  checked: NULL library (NULL / ""). Undefined: a closed library.
 *   cad_library_close       checked: NULL (no-op). Undefined: closing twice; using the plugin's tables
 *                           or any instance of it afterwards.
 *   cad_list_plugin_files   checked: NULL out_paths. cad_string_free: NULL is a no-op; other pointers
 *                           than the ones it returned are undefined.
 *   cad_host_create         checked: NULL options/out, a short options.struct_size, every config error
 *                           (named by file and key path, nesting limited, huge numbers), a plugin's
 *                           create that fails, throws or returns OK without a context. Undefined: the
 *                           same as cad_library_open for hostile plugins.
 *   cad_host_destroy        checked: NULL (no-op); an instance's destroy that throws is logged with the
 *                           plugin file and instance name, and teardown goes on. Undefined: destroying
 *                           twice; using the host, its services tables, or any instance table/context
 *                           obtained from it afterwards -- including plugins that kept the services
 *                           pointer and call it later (e.g. from a thread they did not join).
 *   cad_host_services       checked: NULL host (NULL). The table is valid until cad_host_destroy.
 *   cad_host_find_instance / cad_host_attention / cad_host_instance_info
 *                           checked: NULL host, name, outputs; unknown names; wrong kinds; index out of
 *                           range. Undefined: a host already destroyed.
 *   cad_host_num_instances / cad_host_log_level   checked: NULL host (0 / info).
 *   Calls into plugin tables obtained here are the plugin's contract (plugin_api/); the host does not
 *   wrap them. The `cad` tools never trust their returns (NULL last_error, OK without a result).
 */
#ifndef CAD_HOST_H
#define CAD_HOST_H

#include "cad_plugin_v1.h"

#ifdef __cplusplus
extern "C" {
#endif

/* libcad_host is built with hidden visibility; everything declared here is its public API. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ---- One plugin shared object ---------------------------------------------------------------- */
typedef struct cad_library cad_library_t;

/* Open a plugin by path (contains '/' or ends in ".so") or by name: "NAME" is looked up as
 * cad_NAME.so in, in order: `search_path` (colon-separated, may be NULL), $CAD_PLUGIN_PATH, then the
 * plugin directory next to libcad_host.so (lib/cad/plugins), the build tree's and the install
 * prefix's. Loads with local symbol scope, checks that the entry symbol is the object's own, that the
 * ABI major matches, and the tables' sizes and functions. On success *out owns the loaded object.
 * Thread-safe (loading is serialised internally). */
cad_status_t cad_library_open(const char* name_or_path, const char* search_path, cad_library_t** out,
                              char* error, size_t error_capacity);
const cad_plugin_v1_t* cad_library_plugin(const cad_library_t* library); /* borrowed, static data */
const char* cad_library_path(const cad_library_t* library);              /* resolved absolute path */
void cad_library_close(cad_library_t* library);                          /* NULL is a no-op */

/* Every plugin file (cad_*.so) found in the directories cad_library_open searches (sorted by file name;
 * a file reached through two directories is listed once), as resolved paths joined by '\n' ("" if
 * none). Files are not opened. The returned string is owned by the caller and released with
 * cad_string_free. */
cad_status_t cad_list_plugin_files(const char* search_path, char** out_paths, char* error,
                                   size_t error_capacity);
void cad_string_free(char* s);

/* ---- The configured stack -------------------------------------------------------------------- */
typedef struct cad_host cad_host_t;

/* Out-of-band all-gather for bootstrapping communicators (see cad_host_services_v1_t). */
typedef cad_status_t (*cad_bootstrap_all_gather_fn)(void* user, const void* send, size_t bytes, void* recv);

/* Host collectives lent to plugins as services->host_all_to_all_v / host_all_gather / host_barrier (ABI
 * v1.1; see cad_common_v1.h): the same arguments, with `user` in place of the services' host_ctx. */
typedef cad_status_t (*cad_host_all_to_all_v_fn)(void* user, const void* send, const uint64_t* send_counts,
                                                 const uint64_t* send_displs, void* recv, const uint64_t* recv_counts,
                                                 const uint64_t* recv_displs, int64_t timeout_ms, char* error,
                                                 size_t error_capacity);
typedef cad_status_t (*cad_host_all_gather_fn)(void* user, const void* send, uint64_t bytes, void* recv,
                                               int64_t timeout_ms, char* error, size_t error_capacity);
typedef cad_status_t (*cad_host_barrier_fn)(void* user, int64_t timeout_ms, char* error, size_t error_capacity);

/* Receives every log line of the host and its plugins (source: "host" for the host itself, else the
 * instance name) instead of stderr. Called from any thread, one call at a time. */
typedef void (*cad_host_log_fn)(void* user, cad_log_level_t level, const char* source, const char* message);

/* An application device allocator: serves every CUDA allocation of every plugin of the host (the plugins'
 * services->allocate with device type CUDA, and cad_host_services' own), instead of the host's
 * cudaMallocAsync. It is for sharing the trainer's pool (e.g. PyTorch's caching allocator): two allocators
 * on one GPU starve each other, as one keeps freed blocks cached while the other runs out of memory.
 *   allocate: `bytes` (> 0) on CUDA device `device_id` (whatever the calling thread's current device is),
 *             usable in stream order on `stream` (may be NULL); *out must be aligned to at least 256 bytes
 *             (the host checks: a misaligned block is handed back to free and the allocation fails with
 *             DEVICE_ERROR and a logged message). A status other than OK is passed on to the plugin
 *             (return OUT_OF_MEMORY when the pool is exhausted); OK with *out == NULL is a DEVICE_ERROR.
 *   free:     gets the block back with the device and the byte count it was allocated with and the
 *             plugin's stream (the same as at allocation, by the services' contract). It is also called
 *             for the blocks the plugins leaked, at cad_host_destroy (with stream NULL: the plugin that
 *             owned the stream is gone), so the allocator must outlive the host.
 * Both must be thread-safe: they are called from any thread that calls into a plugin (and from the
 * plugins' own threads). */
typedef cad_status_t (*cad_device_allocate_fn)(void* user, int32_t device_id, size_t bytes, void* stream, void** out);
typedef void (*cad_device_free_fn)(void* user, int32_t device_id, void* ptr, size_t bytes, void* stream);

/* Set struct_size = sizeof(cad_host_options_v1_t); fields past the caller's struct_size read as 0. */
typedef struct cad_host_options_v1 {
  size_t struct_size;
  const char* config_json;  /* the stack config as JSON text, or NULL to read config_path             */
  const char* config_path;  /* a JSON file; also names the source in error messages, and relative
                               "plugin_path" entries are resolved against its directory              */
  const char* search_path;  /* colon-separated dirs searched before the config's "plugin_path" and
                               $CAD_PLUGIN_PATH (may be NULL)                                        */
  cad_bootstrap_all_gather_fn bootstrap_all_gather; /* may be NULL                                    */
  void* bootstrap_user;
  int32_t bootstrap_rank;
  int32_t bootstrap_world_size;
  /* Appended after v1.0 of this header (read only if struct_size covers them): */
  cad_host_log_fn log_callback; /* NULL: log to stderr through spdlog                                 */
  void* log_user;
  /* Appended with ABI v1.1: collectives on CPU memory among bootstrap_rank / bootstrap_world_size, lent
   * to every plugin as services->host_* (the "host" communicator forwards to them). All three or none;
   * they need bootstrap_world_size > 0. */
  cad_host_all_to_all_v_fn host_all_to_all_v;
  cad_host_all_gather_fn host_all_gather;
  cad_host_barrier_fn host_barrier;
  void* collectives_user;
  /* Appended later: the application device allocator above. Both or neither (NULL: cudaMallocAsync on
   * the plugin's stream; with them, CUDA allocations work even in a host built without CUDA). */
  cad_device_allocate_fn device_allocate;
  cad_device_free_fn device_free;
  void* allocator_user;
} cad_host_options_v1_t;

/* Validate the config, load every plugin it names (each file once) and create every instance in order.
 * Each instance gets its own services table: its lookup_plugin sees only instances listed before it,
 * its log lines carry its instance name, and its allocations are tracked (a plugin's leak is logged
 * and freed at cad_host_destroy). On failure the instances created so far are destroyed in reverse
 * order, nothing stays loaded, and `error` names the config, the instance and the plugin file. */
cad_status_t cad_host_create(const cad_host_options_v1_t* options, cad_host_t** out, char* error,
                             size_t error_capacity);
/* Destroys instances in reverse creation order, then unloads the plugins. NULL is a no-op. */
void cad_host_destroy(cad_host_t* host);

/* A host-wide services table (valid until cad_host_destroy), for the host application's own use: its
 * lookup_plugin sees every instance. CUDA allocations return UNSUPPORTED in a build without CUDA, unless
 * the options lent a device allocator. */
const cad_host_services_v1_t* cad_host_services(cad_host_t* host);

/* Find a created instance by name and kind; *out_table is the kind's table. */
cad_status_t cad_host_find_instance(cad_host_t* host, const char* instance_name, cad_plugin_kind_t kind,
                                    const void** out_table, void** out_instance);

/* The instance named by the config's "attention" key: the one the trainer calls. NOT_FOUND if the
 * config names none. */
cad_status_t cad_host_attention(cad_host_t* host, const cad_attention_v1_t** out_table, void** out_instance);

/* The created instances, in creation order (for tools such as `cad check-config`). */
typedef struct cad_host_instance_info_v1 {
  size_t struct_size;             /* set by the caller                                               */
  const char* name;               /* the config's instance name                                      */
  const cad_plugin_v1_t* plugin;  /* its plugin's table (kind, name, version, ...)                    */
  const char* path;               /* the plugin file, resolved                                       */
  const void* table;              /* the kind's table                                                */
  void* instance;                 /* the instance's context                                          */
} cad_host_instance_info_v1_t;
int64_t cad_host_num_instances(const cad_host_t* host);
/* INVALID_ARGUMENT if index is out of range. Strings and tables stay valid until cad_host_destroy. */
cad_status_t cad_host_instance_info(const cad_host_t* host, int64_t index, cad_host_instance_info_v1_t* out);

/* The log level in effect ($CAD_LOG_LEVEL, else the config's "log_level", else info). */
cad_log_level_t cad_host_log_level(const cad_host_t* host);

/* Parse a level name: trace, debug, info, warn, error, off. Returns 0 (and sets *out) on success, -1 if
 * the name is unknown. */
int cad_log_level_from_name(const char* name, cad_log_level_t* out);
const char* cad_plugin_kind_name(cad_plugin_kind_t kind); /* "attention", ...; "unknown" otherwise */
const char* cad_status_name(cad_status_t status);          /* "INVALID_CONFIG", ...                 */

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CAD_HOST_H */
