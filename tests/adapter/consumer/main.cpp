// A 20-line host: loads one plugin through the installed cad::host and prints what it is.
#include <cad/cad_host.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: cad_consumer PLUGIN_NAME_OR_PATH\n");
    return 2;
  }
  try {
    cad::Library library(argv[1]);
    std::printf("loaded %s (%s) from %s; installed plugins: %s\n", library.plugin().name,
                cad_plugin_kind_name(library.plugin().kind), library.path().c_str(), CAD_PLUGIN_DIR);
    return 0;
  } catch (const cad::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
