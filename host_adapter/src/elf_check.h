// elf_check.h -- checks a plugin file before it is handed to the dynamic loader, so that the common
// mistakes (missing file, a text file, an executable, a truncated copy) get a precise message instead
// of whatever dlerror() says.
#pragma once

#include <string>

namespace cad::host {

// Throws HostError(NOT_FOUND or ABI_MISMATCH) with a message that does NOT repeat the path (the caller
// prefixes "plugin <path>: ").
void check_shared_object_file(const std::string& path);

}  // namespace cad::host
