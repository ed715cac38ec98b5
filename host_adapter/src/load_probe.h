// load_probe.h -- loading a plugin file once in a child process before loading it in this one, to refuse
// a plugin whose C++ static initialiser throws. That exception unwinds through glibc's dynamic loader
// without releasing the loader's lock: the load could be refused, but from then on every dlopen, dlclose
// or dlsym-by-handle in any other thread of the process blocks forever (a trainer's backward thread
// loading a cuDNN kernel, for one). Nothing can release that lock afterwards, so it is found first.
#pragma once

#include <functional>
#include <string>

namespace cad::host {

// Forks; the child runs `load` (the caller's own way of opening the file, so that the exception takes the
// same path through the loader as it would here) with stdout and stderr closed and says whether an
// exception escaped. Returns that exception's text ("" if none or if its type is not a
// std::exception: "a non-standard exception"), or "" when the child loaded the file, crashed, exited or
// did not finish within `timeout_ms` (default: $CAD_PLUGIN_PROBE_TIMEOUT_MS, else 10000). Only a
// throwing initialiser is judged here; every other outcome is left to the in-process load, as before.
// Sets *threw accordingly. Never throws.
std::string static_initialiser_exception(const std::function<void()>& load, bool* threw, int timeout_ms = 0);

}  // namespace cad::host
