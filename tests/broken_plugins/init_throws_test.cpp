// init_throws_test.cpp PLUGIN -- a plugin whose C++ static initialiser throws is refused by cad_library_open
// with a message saying so, and the process can still load libraries from other threads afterwards. The
// exception used to unwind through the dynamic loader in this process: the open returned INTERNAL, and the
// loader's lock stayed held, so the next dlopen in any other thread blocked forever (here: SIGALRM).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "cad_host.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s cad_init_throws.so\n", argv[0]);
    return 2;
  }
  alarm(20);  // a deadlock ends the test (killed by SIGALRM) instead of hanging ctest
  char error[2048] = {0};
  cad_library_t* library = nullptr;
  const cad_status_t status = cad_library_open(argv[1], nullptr, &library, error, sizeof error);
  std::printf("cad_library_open: %s: %s\n", cad_status_name(status), error);
  if (status == CAD_STATUS_OK || std::strstr(error, "its static initialiser throws") == nullptr ||
      std::strstr(error, "static initialiser threw on purpose") == nullptr) {
    std::printf("FAIL: expected a refusal naming the throwing static initialiser and its message\n");
    return 1;
  }
  bool loaded = false;
  std::thread other([&] {
    void* handle = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    loaded = handle != nullptr;
    if (handle != nullptr) dlclose(handle);
  });
  other.join();
  std::printf("%s: dlopen in another thread afterwards %s\n", loaded ? "PASS" : "FAIL", loaded ? "works" : "failed");
  return loaded ? 0 : 1;
}
