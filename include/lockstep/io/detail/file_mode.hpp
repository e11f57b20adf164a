#pragma once
/// @file file_mode.hpp
/// The permissions of the files lockstep writes (checkpoints, safetensors weights, traces):
/// write_file_atomically's temporary file, created 0600 by mkstemp, gets the mode open(2) with
/// 0666 would have given it under the process's umask before it is renamed.

#include <cstdlib>
#include <fstream>
#include <string>

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

}  // namespace lockstep::io::detail
