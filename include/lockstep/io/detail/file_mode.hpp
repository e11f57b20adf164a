#pragma once
/// @file file_mode.hpp
/// The permissions of files lockstep writes for other programs to read (safetensors weights,
/// traces): write_file_atomically's temporary file is created 0600, and a file meant to be shared
/// gets the mode open(2) with 0666 would have given it under the process's umask.

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace lockstep::io::detail {

/// The process's umask, read from /proc/self/status without changing it (022 when unknown).
[[nodiscard]] inline unsigned current_umask() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Umask:", 0) == 0) {
      char* end = nullptr;
      const unsigned long m = std::strtoul(line.c_str() + 6, &end, 8);
      if (end != line.c_str() + 6 && m <= 0777) return static_cast<unsigned>(m);
    }
  return 022;
}

/// Gives `path` mode 0666 less the umask (best effort: a failure leaves the file as it is).
inline void make_shareable(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::permissions(path, static_cast<std::filesystem::perms>(0666u & ~current_umask()),
                               std::filesystem::perm_options::replace, ec);
}

}  // namespace lockstep::io::detail
