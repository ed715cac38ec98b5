// cad_host.hpp -- a thin, header-only C++ layer over cad_host.h: RAII owners for a plugin library and
// a configured host, and cad::Error (status + message) thrown wherever the C API returns non-OK.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "cad_host.h"

namespace cad {

class Error : public std::runtime_error {
 public:
  Error(cad_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  cad_status_t status() const { return status_; }

 private:
  cad_status_t status_;
};

namespace detail {
constexpr size_t kErrorCapacity = 2048;
inline void check(cad_status_t status, const char* error) {
  if (status != CAD_STATUS_OK) throw Error(status, error[0] != '\0' ? error : cad_status_name(status));
}
}  // namespace detail

// The message of an instance's last failure, never trusting the plugin: a NULL last_error function or
// return, or an exception escaping it, becomes a sentence saying so (a NULL return crashed `cad plan`
// and `cad demo`). `Table` is any kind table (they all have last_error).
template <class Table>
std::string last_error_of(const Table* table, void* instance) noexcept {
  try {
    if (table == nullptr || table->last_error == nullptr) return "(the plugin has no last_error function)";
    const char* message = table->last_error(instance);
    if (message == nullptr) return "(the plugin's last_error returned NULL)";
    return message;
  } catch (...) {
    return "(the plugin's last_error threw an exception)";
  }
}

// One loaded plugin shared object.
class Library {
 public:
  // See cad_library_open: a path or a plugin name, searched in `search_path` (colon-separated) first.
  explicit Library(const std::string& name_or_path, const char* search_path = nullptr) {
    char error[detail::kErrorCapacity] = {0};
    detail::check(cad_library_open(name_or_path.c_str(), search_path, &library_, error, sizeof error), error);
  }
  ~Library() { cad_library_close(library_); }
  Library(Library&& other) noexcept : library_(std::exchange(other.library_, nullptr)) {}
  Library& operator=(Library&& other) noexcept {
    if (this != &other) {
      cad_library_close(library_);
      library_ = std::exchange(other.library_, nullptr);
    }
    return *this;
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  const cad_plugin_v1_t& plugin() const { return *cad_library_plugin(library_); }
  std::string path() const { return cad_library_path(library_); }
  cad_library_t* get() const { return library_; }

 private:
  cad_library_t* library_ = nullptr;
};

// A configured plugin stack (see cad_host_create).
class Host {
 public:
  // Builds the stack from a JSON config file.
  explicit Host(const std::string& config_path, const char* search_path = nullptr) {
    cad_host_options_v1_t options{};
    options.struct_size = sizeof options;
    options.config_path = config_path.c_str();
    options.search_path = search_path;
    create(options);
  }
  // Full control: the caller fills the options (struct_size included).
  explicit Host(const cad_host_options_v1_t& options) { create(options); }
  ~Host() { cad_host_destroy(host_); }
  Host(Host&& other) noexcept : host_(std::exchange(other.host_, nullptr)) {}
  Host& operator=(Host&& other) noexcept {
    if (this != &other) {
      cad_host_destroy(host_);
      host_ = std::exchange(other.host_, nullptr);
    }
    return *this;
  }
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  // The instance the config names "attention".
  std::pair<const cad_attention_v1_t*, void*> attention() const {
    const cad_attention_v1_t* table = nullptr;
    void* instance = nullptr;
    const cad_status_t status = cad_host_attention(host_, &table, &instance);
    if (status != CAD_STATUS_OK) throw Error(status, "the config names no attention instance");
    return {table, instance};
  }

  // An instance by name; Table is cad_attention_v1_t, cad_communicator_v1_t or cad_balancer_v1_t.
  template <class Table>
  std::pair<const Table*, void*> find(const std::string& name, cad_plugin_kind_t kind) const {
    const void* table = nullptr;
    void* instance = nullptr;
    const cad_status_t status = cad_host_find_instance(host_, name.c_str(), kind, &table, &instance);
    if (status != CAD_STATUS_OK) {
      throw Error(status, std::string("no ") + cad_plugin_kind_name(kind) + " instance named '" + name + "'");
    }
    return {static_cast<const Table*>(table), instance};
  }

  const cad_host_services_v1_t& services() const { return *cad_host_services(host_); }
  cad_host_t* get() const { return host_; }

 private:
  void create(const cad_host_options_v1_t& options) {
    char error[detail::kErrorCapacity] = {0};
    detail::check(cad_host_create(&options, &host_, error, sizeof error), error);
  }
  cad_host_t* host_ = nullptr;
};

}  // namespace cad
