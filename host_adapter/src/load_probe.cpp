// load_probe.cpp -- see load_probe.h.
#include "load_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace cad::host {
namespace {

constexpr char kThrew = 'T';  // first byte of the child's report when an exception escaped

// In the child: only dlopen, then _exit (no atexit handler, no buffered output of the parent).
[[noreturn]] void child_load(const std::function<void()>& load, int fd) {
  const int null_fd = open("/dev/null", O_WRONLY);
  if (null_fd >= 0) {  // the plugin's own output while loading belongs to the real load, not to the probe
    dup2(null_fd, STDOUT_FILENO);
    dup2(null_fd, STDERR_FILENO);
  }
  std::string report;
  try {
    load();
  } catch (const std::exception& e) {
    report = std::string(1, kThrew) + e.what();
  } catch (...) {
    report = std::string(1, kThrew) + "a non-standard exception";
  }
  if (!report.empty() && write(fd, report.data(), report.size()) < 0) _exit(2);
  _exit(0);
}

int probe_timeout_ms(int timeout_ms) {
  if (timeout_ms > 0) return timeout_ms;
  const char* env = std::getenv("CAD_PLUGIN_PROBE_TIMEOUT_MS");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 10000;
}

}  // namespace

std::string static_initialiser_exception(const std::function<void()>& load, bool* threw, int timeout_ms) {
  *threw = false;
  timeout_ms = probe_timeout_ms(timeout_ms);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "";
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return "";
  }
  if (pid == 0) {
    close(fds[0]);
    child_load(load, fds[1]);
  }
  close(fds[1]);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      kill(pid, SIGKILL);  // undecided: the in-process load decides, as without the probe
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    char buffer[1024];
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n <= 0) break;  // the child is done (its write end closed at exit)
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (text.empty() || text[0] != kThrew) return "";
  *threw = true;
  return text.substr(1);
}

}  // namespace cad::host
