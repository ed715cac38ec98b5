// plugin_support.h -- the small C++ toolkit every in-tree plugin is built with (linked statically
// into each plugin; nothing here is exported). It turns C++ failures into ABI status codes, reads
// JSON configs with errors that name the key, checks tensor descriptors with errors that name the
// tensor, and logs through the host's services. Plugins keep their own state in their context; this
// file has no globals.
#pragma once

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cad_plugin_v1.h"

namespace cad::plugin {

// The smallest args struct a callee accepts: its ABI v1.0 size (v1.1 fields are read only when present).
constexpr size_t abi_v1_0_size(const cad_attention_forward_args_v1_t*) { return CAD_ATTENTION_FORWARD_ARGS_V1_0_SIZE; }
constexpr size_t abi_v1_0_size(const cad_attention_backward_args_v1_t*) { return CAD_ATTENTION_BACKWARD_ARGS_V1_0_SIZE; }

// A failure with the status it maps to. Thrown inside a plugin, caught by guarded() at the boundary.
class Failure : public std::exception {
 public:
  Failure(cad_status_t status, std::string message) : status_(status), message_(std::move(message)) {}
  cad_status_t status() const { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  cad_status_t status_;
  std::string message_;
};

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void fail(cad_status_t status, const std::string& message);

// Forward/backward args whose struct_size ends inside the ABI v1.1 fields (it holds `plan` but not
// `saved`) are refused, naming the struct and its size: a backend reads the two together, so a caller
// that passed one of them would otherwise have it ignored (or read) silently.
inline const char* args_struct_name(const cad_attention_forward_args_v1_t*) { return "cad_attention_forward_args_v1_t"; }
inline const char* args_struct_name(const cad_attention_backward_args_v1_t*) { return "cad_attention_backward_args_v1_t"; }
template <class Args>
void refuse_partial_v1_1(const Args* args, const char* call) {
  if (args->struct_size > offsetof(Args, plan) && !CAD_HAS_FIELD(Args, args, saved)) {
    fail(CAD_STATUS_ABI_MISMATCH, format("%s: %s.struct_size is %zu, which ends inside the ABI v1.1 fields (plan, "
                                         "saved): expected %zu (v1.0) or at least %zu", call, args_struct_name(args),
                                         args->struct_size, offsetof(Args, plan),
                                         offsetof(Args, saved) + sizeof(args->saved)));
  }
}

// Logging through the host's services; a no-op when the host lent no logger or the level is below
// the host's threshold.
class Logger {
 public:
  Logger(const cad_host_services_v1_t* services, std::string source)
      : services_(services), source_(std::move(source)) {}
  void log(cad_log_level_t level, const std::string& message) const;
  void debug(const std::string& m) const { log(CAD_LOG_DEBUG, m); }
  void info(const std::string& m) const { log(CAD_LOG_INFO, m); }
  void warn(const std::string& m) const { log(CAD_LOG_WARN, m); }
  bool enabled(cad_log_level_t level) const;
  const cad_host_services_v1_t* services() const { return services_; }
  const std::string& source() const { return source_; }

 private:
  const cad_host_services_v1_t* services_;
  std::string source_;
};

// The part of every plugin context that the ABI requires: the last error. One per calling thread, like errno:
// an instance may be called from two threads (plugin "cad" makes plans ahead on a host thread while the training
// thread runs forward and backward), and one thread's failure must neither overwrite nor free the text another
// thread is reading. The pointer text() returns stays valid until the same thread's next call on the instance.
class ErrorState {
 public:
  void set(std::string message) {
    std::lock_guard<std::mutex> lock(mutex_);
    by_thread_[std::this_thread::get_id()] = std::move(message);
  }
  void clear() { set(std::string()); }
  const char* text() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return by_thread_[std::this_thread::get_id()].c_str();  // node-based map: the string never moves
  }

 private:
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::thread::id, std::string> by_thread_;
};

// Runs `body` and converts whatever it throws into a status + last_error. Use at every ABI entry
// point so that no exception crosses the boundary.
template <class Body>
cad_status_t guarded(ErrorState& state, Body&& body) noexcept {
  try {
    body();
    state.clear();
    return CAD_STATUS_OK;
  } catch (const Failure& f) {
    state.set(f.what());
    return f.status();
  } catch (const std::bad_alloc&) {
    state.set("out of memory");
    return CAD_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    state.set(std::string("internal error: ") + e.what());
    return CAD_STATUS_INTERNAL;
  } catch (...) {
    state.set("internal error: unknown exception");
    return CAD_STATUS_INTERNAL;
  }
}

// Implements the ABI's create contract for a context type `Ctx` constructible as
// Ctx(services, config_json): validates the services table, builds the context, and on failure
// writes the message into the caller's buffer.
void copy_message(const std::string& message, char* buffer, size_t capacity);
cad_status_t check_services(const cad_host_services_v1_t* services, std::string* message);

template <class Ctx>
cad_status_t create_context(const cad_host_services_v1_t* services, const char* config_json, void** out_ctx,
                            char* error_message, size_t error_capacity) noexcept {
  std::string message;
  cad_status_t status = CAD_STATUS_OK;
  if (out_ctx == nullptr) {
    copy_message("create: out_ctx is NULL", error_message, error_capacity);
    return CAD_STATUS_INVALID_ARGUMENT;
  }
  status = check_services(services, &message);
  if (status != CAD_STATUS_OK) {
    copy_message(message, error_message, error_capacity);
    return status;
  }
  try {
    *out_ctx = new Ctx(services, config_json);
    return CAD_STATUS_OK;
  } catch (const Failure& f) {
    message = f.what();
    status = f.status();
  } catch (const std::bad_alloc&) {
    message = "out of memory";
    status = CAD_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
    status = CAD_STATUS_INTERNAL;
  } catch (...) {
    message = "internal error: unknown exception";
    status = CAD_STATUS_INTERNAL;
  }
  copy_message(message, error_message, error_capacity);
  return status;
}

// Implements the get_stats_json contract for an already rendered JSON text: checks the pointers, stores
// the size needed (including the NUL) in *needed, and copies the text, or fails with
// CAD_STATUS_INVALID_ARGUMENT when it does not fit `capacity`.
void write_json_result(const std::string& json, char* buffer, size_t capacity, size_t* needed);

// Reads a plugin's JSON config. Every getter records the key as known; finish() warns about the
// rest. Errors throw Failure(CAD_STATUS_INVALID_CONFIG) naming `source` ("plugin 'mpi' config")
// and the key, with the expected type or range.
class ConfigReader {
 public:
  ConfigReader(const char* config_json, std::string source);
  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback, int64_t min_value, int64_t max_value);
  double get_double(const std::string& key, double fallback, double min_value, double max_value);
  bool get_bool(const std::string& key, bool fallback);
  std::string get_string(const std::string& key, const std::string& fallback);
  // A string that must be one of `allowed`.
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& allowed);
  // The raw JSON value (records the key), or null if absent.
  nlohmann::json get_json(const std::string& key);
  // Log a warning for each key no getter asked for.
  void finish(const Logger& logger) const;
  const nlohmann::json& json() const { return json_; }

 private:
  [[noreturn]] void bad(const std::string& key, const std::string& expected) const;
  nlohmann::json json_;
  std::string source_;
  std::set<std::string> known_;
};

// dtype helpers.
enum class DType { F32, BF16 };
const char* dtype_name(const cad_dtype_v1_t& dtype);
bool dtype_is(const cad_dtype_v1_t& dtype, DType want);

// Checks one tensor argument: non-NULL, data non-NULL (unless it has zero elements), the expected
// device type, rank, shape (-1 = any; `dims` names each dim for the message) and dtype, and compact
// row-major strides. Throws Failure(CAD_STATUS_INVALID_ARGUMENT) naming the tensor (and `fixed_by`, where the
// expected extents and dtype are a plan's).
struct TensorSpec {
  const char* name;                 // e.g. "q"
  cad_device_type_t device_type;
  std::vector<int64_t> shape;       // expected extents, -1 = any
  std::vector<const char*> dims;    // names of the dims, e.g. {"Tq", "Hq", "D"}
  std::vector<DType> dtypes;        // accepted dtypes
  const char* fixed_by = nullptr;   // what fixed the expected shape and dtype, for messages (e.g. "plan #3"), or NULL
};
void check_tensor(const cad_tensor_v1_t* tensor, const TensorSpec& spec);

// Start of the tensor's data (data + byte_offset).
inline void* tensor_data(const cad_tensor_v1_t* t) {
  return static_cast<char*>(t->data) + t->byte_offset;
}
int64_t tensor_numel(const cad_tensor_v1_t* t);

// Checks one side of all_to_all_v: counts and displs non-NULL, buffer non-NULL where a count is
// non-zero, and buffer + displs[p] + counts[p] representable for every peer p (no wrap-around of the
// address). Throws INVALID_ARGUMENT naming `side` ("send"/"recv") and the peer.
void check_byte_layout(const char* side, const void* buffer, const uint64_t* counts, const uint64_t* displs,
                       int world);

// Validate a segment table against Tq and Tk: non-negative lengths, in-bounds ranges, queries of
// different segments disjoint, q_len <= kv_len when causal. Throws INVALID_ARGUMENT naming the segment.
void check_segments(const cad_segment_v1_t* segments, int64_t num_segments, int64_t tq, int64_t tk,
                    bool causal);

}  // namespace cad::plugin
