// elf_check.cpp -- see elf_check.h. Reads the ELF header and program/section header tables only.
#include "elf_check.h"

#include <elf.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

#include "host_error.h"

namespace cad::host {
namespace {

const char* elf_type_name(uint16_t type) {
  switch (type) {
    case ET_REL: return "a relocatable object (.o)";
    case ET_EXEC: return "an executable";
    case ET_CORE: return "a core dump";
    default: return "an unknown ELF file type";
  }
}

}  // namespace

void check_shared_object_file(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int err = errno;
    raise(CAD_STATUS_NOT_FOUND, err == ENOENT ? "file not found" : std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(info.st_mode)) raise(CAD_STATUS_NOT_FOUND, "not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) raise(CAD_STATUS_NOT_FOUND, std::string("cannot open: ") + std::strerror(errno));
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);

  Elf64_Ehdr header{};
  in.read(reinterpret_cast<char*>(&header), sizeof header);
  const bool has_magic = in.gcount() >= SELFMAG && std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0;
  if (!has_magic) raise(CAD_STATUS_ABI_MISMATCH, "not a shared object (no ELF header)");
  if (static_cast<size_t>(in.gcount()) < sizeof header) {
    raise(CAD_STATUS_ABI_MISMATCH, "truncated: the file has " + std::to_string(file_size) +
                                       " bytes, fewer than one ELF header");
  }
  // 32-bit or foreign-endian objects: leave the exact wording to the dynamic loader.
  if (header.e_ident[EI_CLASS] != ELFCLASS64) return;
  if (header.e_type != ET_DYN) {
    raise(CAD_STATUS_ABI_MISMATCH, std::string("not a shared object: it is ") + elf_type_name(header.e_type));
  }

  // The file must hold every table the header points to and every segment the loader will map.
  uint64_t needed = std::max<uint64_t>(header.e_shoff + uint64_t{header.e_shnum} * header.e_shentsize,
                                       header.e_phoff + uint64_t{header.e_phnum} * header.e_phentsize);
  if (header.e_phoff + uint64_t{header.e_phnum} * header.e_phentsize <= file_size &&
      header.e_phentsize == sizeof(Elf64_Phdr)) {
    std::vector<Elf64_Phdr> segments(header.e_phnum);
    in.seekg(static_cast<std::streamoff>(header.e_phoff));
    in.read(reinterpret_cast<char*>(segments.data()),
            static_cast<std::streamsize>(segments.size() * sizeof(Elf64_Phdr)));
    if (in) {
      for (const Elf64_Phdr& s : segments) {
        needed = std::max<uint64_t>(needed, s.p_offset + s.p_filesz);
        // An interpreter request marks a (position-independent) executable, which is ET_DYN too.
        if (s.p_type == PT_INTERP) raise(CAD_STATUS_ABI_MISMATCH, "not a shared object: it is an executable");
      }
    }
  }
  if (needed > file_size) {
    raise(CAD_STATUS_ABI_MISMATCH, "truncated: the file has " + std::to_string(file_size) +
                                       " bytes, its ELF headers describe " + std::to_string(needed));
  }
}

}  // namespace cad::host
