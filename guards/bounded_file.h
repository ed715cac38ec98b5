// bounded_file.h -- reading a file a user names (a config, a rate table, a calibration, a length file) with
// the two checks every such read needs: it is a regular file, and it is no larger than its cap.
//
// An unchecked `std::ifstream in(path); text << in.rdbuf();` blocks forever in open() on a FIFO with no
// writer, and reads without bound from /dev/zero or /dev/urandom. Here the path is opened non-blocking (a
// FIFO's open returns at once), the opened descriptor is checked to be a regular file (so a path swapped
// after a check cannot slip through), and at most cap + 1 bytes are read (a file that grows while it is
// read still stops there). Header-only, POSIX, no dependencies: the plugins, the host adapter and the tools
// all include it, and each caller turns the message into its own error type.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

namespace cad::files {

enum class ReadStatus { kOk, kNotFound, kCannotRead, kNotRegular, kTooLarge };

// Reads the file at `path` into *text. Anything but kOk comes with *error naming `what` (e.g. "--trainer"),
// the path and the reason: it does not exist or cannot be opened, is not a regular file, or holds more
// than max_bytes bytes.
inline ReadStatus read_regular_file(const std::string& path, int64_t max_bytes, const std::string& what, std::string* text,
                              std::string* error) {
  const std::string who = what.empty() ? path : what + " " + path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    *error = who + ": cannot open (" + std::strerror(err) + ")";
    return err == ENOENT ? ReadStatus::kNotFound : ReadStatus::kCannotRead;
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *error = who + ": cannot stat (" + std::strerror(errno) + ")";
    return ReadStatus::kCannotRead;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = who + ": not a regular file (a directory, device, FIFO or socket has no end to read to)";
    return ReadStatus::kNotRegular;
  }
  const auto mib = [](int64_t bytes) {
    return bytes >= (int64_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes) + " bytes";
  };
  if (st.st_size > max_bytes) {
    *error = who + ": " + std::to_string(static_cast<long long>(st.st_size)) + " bytes, larger than " + mib(max_bytes) +
             ", the most this file may hold";
    return ReadStatus::kTooLarge;
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size) + 1);
  size_t used = 0;
  char chunk[1 << 14];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = who + ": read failed (" + std::strerror(errno) + ")";
      return ReadStatus::kCannotRead;
    }
    if (n == 0) break;
    if (static_cast<int64_t>(used) + n > max_bytes) {  // grew past the cap while being read
      *error = who + ": larger than " + mib(max_bytes) + ", the most this file may hold";
      return ReadStatus::kTooLarge;
    }
    if (used + static_cast<size_t>(n) > out.size()) out.resize(used + static_cast<size_t>(n));
    std::memcpy(&out[used], chunk, static_cast<size_t>(n));
    used += static_cast<size_t>(n);
  }
  out.resize(used);
  *text = std::move(out);
  return ReadStatus::kOk;
}

// The caps of the files the project reads: JSON configs, rate tables and calibrations are kilobytes (the
// largest shipped is ~15 KB), so 16 MiB leaves room for any real one; length files have their own cap
// (workload/doc_lengths.h).
constexpr int64_t kMaxJsonFileBytes = int64_t{16} << 20;

}  // namespace cad::files
