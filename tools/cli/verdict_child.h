// verdict_child.h -- running a command that executes plugin code in a child process, so that only a
// verdict the command itself reached can end it. A plugin that calls _exit(0) (no atexit handler runs)
// or crashes would otherwise end `cad check-config` or `cad conformance` with no output -- and, for
// _exit(0), with a success a conformance gate would pass.
#pragma once

#include <functional>

namespace cad::cli {

// Forks. The child runs `body`, sends the status it returned to the parent through a pipe and returns
// it (so the child exits the normal way: atexit handlers and sanitizer reports run there). The parent
// waits for the child and returns:
//   - the verdict, when the child sent one and then exited with that same status;
//   - the child's exit status, when it differs from the verdict (something at exit -- a plugin's
//     destructor, a leak report -- failed after the command finished), with a line on stderr;
//   - 3 when the child ended without a verdict (exit/_exit in plugin code, a crash), with a line on
//     stderr naming `command` and how the child ended.
// The child is killed if the parent dies (PR_SET_PDEATHSIG), so mpirun's job control still reaches it.
int run_with_verdict(const char* command, const std::function<int()>& body);

}  // namespace cad::cli
