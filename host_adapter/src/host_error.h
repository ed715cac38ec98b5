// host_error.h -- how the host library reports failures internally (HostError) and turns them into
// a status plus a one-line message at its C API boundary (c_boundary), so no exception escapes.
#pragma once

#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "cad_common_v1.h"

namespace cad::host {

class HostError : public std::runtime_error {
 public:
  HostError(cad_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  cad_status_t status() const { return status_; }

 private:
  cad_status_t status_;
};

[[noreturn]] inline void raise(cad_status_t status, const std::string& message) {
  throw HostError(status, message);
}

// Copies `message` (truncated, always NUL-terminated) into the caller's buffer, if it lent one.
inline void write_message(const std::string& message, char* buffer, size_t capacity) {
  if (buffer == nullptr || capacity == 0) return;
  const size_t n = message.size() < capacity - 1 ? message.size() : capacity - 1;
  std::memcpy(buffer, message.data(), n);
  buffer[n] = '\0';
}

// Runs `body` at a C API entry point: returns its status, or the status of whatever it threw with the
// message written into (error, error_capacity).
template <class Body>
cad_status_t c_boundary(char* error, size_t error_capacity, Body&& body) noexcept {
  try {
    body();
    return CAD_STATUS_OK;
  } catch (const HostError& e) {
    write_message(e.what(), error, error_capacity);
    return e.status();
  } catch (const std::bad_alloc&) {
    write_message("out of memory", error, error_capacity);
    return CAD_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    write_message(std::string("internal error: ") + e.what(), error, error_capacity);
    return CAD_STATUS_INTERNAL;
  } catch (...) {
    write_message("internal error: unknown exception", error, error_capacity);
    return CAD_STATUS_INTERNAL;
  }
}

}  // namespace cad::host
