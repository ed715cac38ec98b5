// plugin_probe.cpp -- see plugin_probe.h.
#include "plugin_probe.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "cad_host.h"
#include "command.h"

namespace cad::cli {
namespace {

std::string or_empty(const char* s) { return s != nullptr ? s : ""; }

// In the child: open the plugin, describe it as JSON (invalid UTF-8 from the plugin replaced, so that
// the text always serialises), write it to `fd`. Only _exit from here: the parent's atexit handlers
// and buffered output must not run twice.
[[noreturn]] void child_describe(const std::string& path, int fd) {
  nlohmann::json out;
  char error[2048] = {0};
  cad_library_t* library = nullptr;
  if (cad_library_open(path.c_str(), nullptr, &library, error, sizeof error) != CAD_STATUS_OK) {
    out["error"] = error;
  } else {
    const cad_plugin_v1_t* plugin = cad_library_plugin(library);
    out["kind"] = cad_plugin_kind_name(plugin->kind);
    out["name"] = or_empty(plugin->name);
    out["abi"] = std::to_string(plugin->abi_major) + "." + std::to_string(plugin->abi_minor);
    out["version"] = or_empty(plugin->version);
    out["description"] = or_empty(plugin->description);
    // Not closed: unloading runs the plugin's destructors, which are not what is probed here.
  }
  const std::string text = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) _exit(3);
    done += static_cast<size_t>(n);
  }
  _exit(0);
}

std::string exit_reason(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sigabbrev_np(sig);
    return std::string("crashed while loading (signal ") + (name != nullptr ? std::string("SIG") + name : std::to_string(sig)) +
           (sig == SIGABRT ? "; an exception escaping its static initialiser or entry function aborts too" : "") + ")";
  }
  return "ended the process while loading (exit status " + std::to_string(WEXITSTATUS(status)) +
         ") before its table could be read: a plugin must never call exit()";
}

}  // namespace

ProbeResult probe_plugin(const std::string& path, int timeout_ms) {
  if (timeout_ms <= 0) {
    const char* env = std::getenv("CAD_PLUGIN_PROBE_TIMEOUT_MS");
    timeout_ms = env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 10000;
  }
  ProbeResult result;
  int fds[2];
  if (pipe(fds) != 0) {
    result.error = "plugin " + path + ": cannot probe (pipe failed)";
    return result;
  }
  std::fflush(nullptr);  // the child must not flush our buffered output a second time
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    result.error = "plugin " + path + ": cannot probe (fork failed)";
    return result;
  }
  if (pid == 0) {
    close(fds[0]);
    forget_running_command();  // an exit() in the plugin ends the child with the plugin's own status
    // What the plugin prints while loading must not mix with our output (`--json` stays parseable).
    if (std::freopen("/dev/null", "w", stdout) == nullptr) _exit(3);
    child_describe(path, fds[1]);
  }
  close(fds[1]);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;  // timeout or EINTR: re-check the clock
    char buffer[4096];
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n <= 0) break;  // the child closed its end: it exited or died
    text.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) {
    result.error = "plugin " + path + ": hung while loading (killed after " + std::to_string(timeout_ms) +
                   " ms in its static initialiser or entry function)";
    return result;
  }
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) || text.empty()) {
    result.error = "plugin " + path + ": " + exit_reason(status);
    return result;
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    result.error = "plugin " + path + ": the probe returned no description";
  } else if (j.contains("error")) {
    result.error = j["error"].get<std::string>();
  } else {
    result.kind = j.value("kind", "");
    result.name = j.value("name", "");
    result.abi = j.value("abi", "");
    result.version = j.value("version", "");
    result.description = j.value("description", "");
  }
  return result;
}

}  // namespace cad::cli
