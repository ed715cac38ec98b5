// plan_plot.cpp -- see plan_plot.h.
#include "plan_plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

extern char** environ;

namespace cad::cli {

namespace {

// The script next to the sources (a build tree) or in the install prefix's data directory.
std::string find_script() {
  std::vector<std::string> candidates;
#ifdef CAD_SOURCE_CLI_DIR
  candidates.push_back(std::string(CAD_SOURCE_CLI_DIR) + "/plot_plan.py");
#endif
#ifdef CAD_INSTALL_DATA_DIR
  candidates.push_back(std::string(CAD_INSTALL_DATA_DIR) + "/plot_plan.py");
#endif
  std::string tried;
  for (const auto& c : candidates) {
    if (std::filesystem::is_regular_file(c)) return c;
    tried += (tried.empty() ? "" : ", ") + c;
  }
  throw std::runtime_error("--plot: the drawing script plot_plan.py is not installed (looked in " + tried + ")");
}

// The report in a private temporary file (mkstemp: mode 0600, a name nobody else chose).
std::string write_report(const nlohmann::json& report) {
  const char* tmp = std::getenv("TMPDIR");
  std::string name = std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") + "/cad_plan_XXXXXX";
  const int fd = mkstemp(name.data());
  if (fd < 0) throw std::runtime_error("--plot: cannot create a temporary file " + name + ": " + std::strerror(errno));
  const std::string text = report.dump();
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      close(fd);
      unlink(name.c_str());
      throw std::runtime_error("--plot: cannot write " + name + ": " + why);
    }
    written += static_cast<size_t>(n);
  }
  close(fd);
  return name;
}

}  // namespace

void plot_plan(const nlohmann::json& report, const std::string& out) {
  if (out.empty()) throw std::runtime_error("--plot: expected an output file name, got ''");
  const std::string script = find_script();
  const std::string data = write_report(report);
  std::string out_arg = "--out=" + out;  // one argument even if OUT starts with '-'
  std::vector<char*> argv = {const_cast<char*>("python3"), const_cast<char*>(script.c_str()), out_arg.data(),
                             const_cast<char*>(data.c_str()), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "python3", nullptr, nullptr, argv.data(), environ);
  int status = 0;
  if (spawned == 0) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  unlink(data.c_str());
  if (spawned != 0) {
    throw std::runtime_error(std::string("--plot needs python3 with matplotlib; python3 could not be started (") +
                             std::strerror(spawned) + ")");
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code == 127) throw std::runtime_error("--plot needs python3 with matplotlib; python3 is not on PATH");
  if (code == 3) throw std::runtime_error("--plot needs matplotlib for python3 (pip install matplotlib)");
  if (code != 0) {
    throw std::runtime_error("--plot: drawing " + out + " failed (" + script + " exited with status " +
                             std::to_string(code) + "; its message is above)");
  }
  std::fprintf(stderr, "cad plan: plot written to %s\n", out.c_str());
}

}  // namespace cad::cli
