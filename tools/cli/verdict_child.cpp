// verdict_child.cpp -- see verdict_child.h.
#include "verdict_child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace cad::cli {
namespace {

constexpr int kNoVerdict = 3;  // the status `cad` already uses for "a plugin ended the process"

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return "was killed by signal " + (name != nullptr ? std::string("SIG") + name : std::to_string(WTERMSIG(status)));
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

// Reads the child's verdict from `fd` after the child is gone. Returns false if none came (fewer
// bytes than an int: the child ended before the command returned).
bool read_verdict(int fd, int* verdict) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);  // whatever is in the pipe now, nothing more
  char bytes[sizeof(int)];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = read(fd, bytes + got, sizeof bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != sizeof bytes) return false;
  memcpy(verdict, bytes, sizeof bytes);
  return true;
}

}  // namespace

int run_with_verdict(const char* command, const std::function<int()>& body) {
  int fds[2];
  if (pipe(fds) != 0) {
    std::fprintf(stderr, "cad %s: cannot create a pipe for the child process (%s)\n", command, strerror(errno));
    return 1;
  }
  std::fflush(nullptr);  // the child must not flush our buffered output a second time
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    std::fprintf(stderr, "cad %s: cannot fork a child process (%s)\n", command, strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return 1;
  }
  if (pid == 0) {
    close(fds[0]);
    // A job launcher (mpirun, a CI timeout) signals the process it started: take the child with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(kNoVerdict);  // the parent died before prctl took effect
    const int verdict = body();
    std::fflush(nullptr);
    // Written in one call: a pipe write of a few bytes is atomic, so the parent reads all or nothing.
    if (write(fds[1], &verdict, sizeof verdict) != static_cast<ssize_t>(sizeof verdict)) _exit(kNoVerdict);
    close(fds[1]);
    return verdict;
  }
  close(fds[1]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int verdict = 0;
  // The pipe is read after the child is gone, without blocking: a process the plugin started may hold
  // its write end open, and must not keep the parent waiting for an end of file.
  const bool has_verdict = read_verdict(fds[0], &verdict);
  close(fds[0]);
  if (!has_verdict) {
    std::fprintf(stderr,
                 "cad %s: the command ended without a verdict: its process %s before the command finished "
                 "(plugin code called exit() or _exit(), or crashed); failing with status %d\n",
                 command, how_it_ended(status).c_str(), kNoVerdict);
    return kNoVerdict;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == verdict) return verdict;
  std::fprintf(stderr, "cad %s: the command finished with status %d, but its process then %s (at exit: a "
                       "plugin's destructor, or a sanitizer report)\n",
               command, verdict, how_it_ended(status).c_str());
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return verdict != 0 ? verdict : kNoVerdict;
}

}  // namespace cad::cli
