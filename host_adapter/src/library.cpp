// library.cpp -- loading a plugin with libltdl: local symbol scope, the entry symbol must be the
// object's own, the ABI major must match, and the tables must be complete. Every refusal is one line
// naming the file and the cause, and leaves nothing loaded.
#include "library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "elf_check.h"
#include "host_error.h"
#include "load_probe.h"
#include "plugin_table.h"
#include "search_path.h"

namespace cad::host {
namespace {

// libltdl keeps process-wide state and is not thread-safe: every call into it holds this lock.
// lt_dlinit/lt_dlexit are reference counted by libltdl, one pair per open library.
std::mutex& ltdl_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::string ltdl_error(const char* fallback) {
  const char* message = lt_dlerror();
  return message != nullptr ? message : fallback;
}

// Why the dynamic loader refused `path`. libltdl reports most loader failures as "file not found",
// hiding dlerror()'s reason (an undefined symbol, a missing dependency, a wrong ELF class), so ask the
// system loader directly, once, with the same local scope, purely for the message.
std::string loader_failure_reason(const std::string& path) {
  const std::string from_ltdl = ltdl_error("unknown loader error");
  dlerror();
  void* probe = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (probe != nullptr) {
    dlclose(probe);
    return from_ltdl;
  }
  const char* reason = dlerror();
  return reason != nullptr ? reason : from_ltdl;
}

// Loads `path` with local scope. Called with the lock held. Returns NULL with *error set on failure.
lt_dlhandle open_local(const std::string& path, std::string* error) {
  if (lt_dlinit() != 0) {
    *error = "cannot initialise libltdl: " + ltdl_error("unknown error");
    return nullptr;
  }
  lt_dladvise advise = nullptr;
  lt_dlhandle handle = nullptr;
  if (lt_dladvise_init(&advise) == 0 && lt_dladvise_local(&advise) == 0) {
    handle = lt_dlopenadvise(path.c_str(), advise);
    if (handle == nullptr) *error = "cannot load: " + loader_failure_reason(path);
  } else {
    *error = "cannot set up libltdl: " + ltdl_error("unknown error");
  }
  if (advise != nullptr) lt_dladvise_destroy(&advise);
  if (handle == nullptr) lt_dlexit();
  return handle;
}

void* find_symbol(lt_dlhandle handle, const char* name) {
  void* symbol = lt_dlsym(handle, name);
  if (symbol == nullptr) lt_dlerror();  // clear the "symbol not found" state
  return symbol;
}

// Why the object has no v1 entry: a different major's entry, or none at all.
std::string missing_entry_reason(lt_dlhandle handle) {
  for (int major = 2; major <= 9; ++major) {
    const std::string other = "cad_plugin_entry_v" + std::to_string(major);
    if (find_symbol(handle, other.c_str()) != nullptr) {
      return "built for plugin ABI " + std::to_string(major) + ", this host supports ABI " +
             std::to_string(CAD_ABI_VERSION_MAJOR) + " (it exports " + other + ", not " +
             CAD_PLUGIN_ENTRY_SYMBOL_V1 + ")";
    }
  }
  return "no entry symbol " CAD_PLUGIN_ENTRY_SYMBOL_V1 " (not a CAD plugin, or built without CAD_PLUGIN_EXPORT)";
}

// The file that defines `symbol`, canonical, or "" if the loader cannot tell.
std::string defining_file(void* symbol) {
  Dl_info info{};
  if (dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "";
  return canonical_or_absolute(info.dli_fname);
}

// Everything after a successful dlopen; returns the reason for refusal, or "" with *out set.
std::string inspect_loaded(lt_dlhandle handle, const std::string& path, const cad_plugin_v1_t** out) {
  void* entry = find_symbol(handle, CAD_PLUGIN_ENTRY_SYMBOL_V1);
  if (entry == nullptr) return missing_entry_reason(handle);
  const std::string owner = defining_file(entry);
  if (owner != path) {
    return std::string("entry symbol " CAD_PLUGIN_ENTRY_SYMBOL_V1 " resolves in ") +
           (owner.empty() ? "an unknown object" : owner) + ", not in the plugin itself";
  }
  const auto entry_fn = reinterpret_cast<cad_plugin_entry_v1_fn>(entry);
  const cad_plugin_v1_t* plugin = nullptr;
  try {
    plugin = entry_fn();
  } catch (const std::exception& e) {
    return std::string("the entry function let an exception escape through the C ABI: ") + e.what();
  } catch (...) {
    return "the entry function let a non-standard exception escape through the C ABI";
  }
  try {
    check_plugin_table(plugin);
  } catch (const HostError& e) {
    return e.what();
  }
  *out = plugin;
  return "";
}

}  // namespace

cad_library* open_library(const std::string& name_or_path, const std::vector<std::string>& search_dirs) {
  const std::string file = resolve_plugin_file(name_or_path, search_dirs);
  const std::string path = canonical_or_absolute(file);
  const std::string prefix = "plugin " + path + ": ";
  try {
    check_shared_object_file(path);
  } catch (const HostError& e) {
    raise(e.status(), prefix + e.what());
  }
  auto library = std::make_unique<cad_library>();
  library->path = path;
  std::string error;
  cad_status_t status = CAD_STATUS_ABI_MISMATCH;
  {
    std::lock_guard<std::mutex> lock(ltdl_mutex());
    // Forked with the lock held, so the child's copy of libltdl is not in another thread's hands. Skipped
    // where CAD_PLUGIN_PROBE=0: a process that must not fork (a trainer holding GPU mappings and NCCL
    // threads, which the Python package sets it for) then loads the file directly.
    bool threw = false;
    const char* probe = std::getenv("CAD_PLUGIN_PROBE");
    const bool probing = probe == nullptr || std::string(probe) != "0";
    const std::string what = !probing ? std::string() : static_initialiser_exception(
        [&] {
          std::string ignored;
          open_local(path, &ignored);
        },
        &threw);
    if (threw) {
      raise(CAD_STATUS_ABI_MISMATCH,
            prefix + "its static initialiser throws (" + what + "; found by loading it in a child process): "
            "not loaded, since an exception leaving the dynamic loader keeps its lock and every later library "
            "load in another thread of this process would block forever");
    }
    library->handle = open_local(path, &error);
    if (library->handle != nullptr) {
      error = inspect_loaded(library->handle, path, &library->plugin);
      if (!error.empty()) {
        lt_dlclose(library->handle);
        lt_dlexit();
        library->handle = nullptr;
      }
    }
  }
  if (library->handle == nullptr) {
    // dlerror() often repeats the path; keep the line short by dropping a leading "<path>: ".
    if (error.compare(0, 13, "cannot load: ") == 0 && error.compare(13, path.size() + 2, path + ": ") == 0) {
      error = "cannot load: " + error.substr(13 + path.size() + 2);
    }
    raise(status, prefix + error);
  }
  return library.release();
}

void close_library(cad_library* library) noexcept {
  if (library == nullptr) return;
  if (library->handle != nullptr) {
    std::lock_guard<std::mutex> lock(ltdl_mutex());
    lt_dlclose(library->handle);
    lt_dlexit();
  }
  delete library;
}

}  // namespace cad::host

// ---- C API ------------------------------------------------------------------------------------------

extern "C" cad_status_t cad_library_open(const char* name_or_path, const char* search_path, cad_library_t** out,
                                         char* error, size_t error_capacity) {
  return cad::host::c_boundary(error, error_capacity, [&] {
    if (name_or_path == nullptr) cad::host::raise(CAD_STATUS_INVALID_ARGUMENT, "cad_library_open: name_or_path is NULL");
    if (out == nullptr) cad::host::raise(CAD_STATUS_INVALID_ARGUMENT, "cad_library_open: out is NULL");
    const auto dirs = cad::host::plugin_search_dirs(cad::host::split_path_list(search_path));
    *out = cad::host::open_library(name_or_path, dirs);
  });
}

extern "C" const cad_plugin_v1_t* cad_library_plugin(const cad_library_t* library) {
  return library != nullptr ? library->plugin : nullptr;
}

extern "C" const char* cad_library_path(const cad_library_t* library) {
  return library != nullptr ? library->path.c_str() : "";
}

extern "C" void cad_library_close(cad_library_t* library) { cad::host::close_library(library); }

extern "C" cad_status_t cad_list_plugin_files(const char* search_path, char** out_paths, char* error,
                                              size_t error_capacity) {
  return cad::host::c_boundary(error, error_capacity, [&] {
    if (out_paths == nullptr) cad::host::raise(CAD_STATUS_INVALID_ARGUMENT, "cad_list_plugin_files: out_paths is NULL");
    std::string joined;
    for (const auto& path : cad::host::list_plugin_files(
             cad::host::plugin_search_dirs(cad::host::split_path_list(search_path)))) {
      joined += (joined.empty() ? "" : "\n") + path;
    }
    char* copy = static_cast<char*>(std::malloc(joined.size() + 1));
    if (copy == nullptr) throw std::bad_alloc();
    std::memcpy(copy, joined.c_str(), joined.size() + 1);
    *out_paths = copy;
  });
}

extern "C" void cad_string_free(char* s) { std::free(s); }
