// comm_plugin.h -- test-side access to a communicator plugin through its ABI alone: dlopen the .so,
// lend a minimal services table, and wrap instances so every test reads like the host would use it.
// (The tests never call MPI themselves: the plugin owns MPI's lifetime, as it would in a host.)
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "cad_plugin_v1.h"

namespace cad::mpi_test {

inline void log_to_stderr(void*, cad_log_level_t level, const char* source, const char* message) {
  std::fprintf(stderr, "[%s:%d] %s\n", source, level, message);
}

inline cad_host_services_v1_t make_services() {
  cad_host_services_v1_t s{};
  s.struct_size = sizeof(s);
  s.abi_major = CAD_ABI_VERSION_MAJOR;
  s.abi_minor = CAD_ABI_VERSION_MINOR;
  s.log_level = CAD_LOG_WARN;
  s.log = log_to_stderr;
  s.bootstrap_rank = -1;
  return s;
}

// Loads the plugin once per process; never unloaded (MPI lives in it until exit).
inline const cad_communicator_v1_t* communicator_table(const char* path) {
  static const cad_communicator_v1_t* table = [path]() -> const cad_communicator_v1_t* {
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) throw std::runtime_error(std::string("dlopen failed: ") + dlerror());
    auto entry = reinterpret_cast<cad_plugin_entry_v1_fn>(dlsym(handle, CAD_PLUGIN_ENTRY_SYMBOL_V1));
    if (entry == nullptr) throw std::runtime_error("no entry symbol in " + std::string(path));
    return entry()->communicator;
  }();
  return table;
}

// One communicator instance; create() reports through status()/error() instead of throwing.
class Comm {
 public:
  Comm(const cad_communicator_v1_t* table, const std::string& config) : table_(table) {
    static const cad_host_services_v1_t services = make_services();
    char message[1024] = {0};
    status_ = table_->create(&services, config.c_str(), &ctx_, message, sizeof(message));
    create_error_ = message;
  }
  ~Comm() {
    if (ctx_ != nullptr) table_->destroy(ctx_);
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  cad_status_t create_status() const { return status_; }
  const std::string& create_error() const { return create_error_; }
  void* ctx() const { return ctx_; }
  const cad_communicator_v1_t* table() const { return table_; }
  std::string last_error() const { return table_->last_error(ctx_); }
  int rank() const {
    int32_t r = -1;
    table_->get_rank(ctx_, &r);
    return r;
  }
  int world() const {
    int32_t w = -1;
    table_->get_world_size(ctx_, &w);
    return w;
  }
  cad_status_t barrier() const { return table_->barrier(ctx_, nullptr); }
  cad_status_t all_gather(const void* send, uint64_t bytes, void* recv) const {
    return table_->all_gather(ctx_, send, bytes, recv, nullptr);
  }

 private:
  const cad_communicator_v1_t* table_;
  void* ctx_ = nullptr;
  cad_status_t status_ = CAD_STATUS_INTERNAL;
  std::string create_error_;
};

}  // namespace cad::mpi_test
