#pragma once
/// @file build_check.hpp
/// The warning a program compiled without optimisation prints once: lockstep is header-only, so
/// its speed is decided by how the user's program is compiled, and an -O0 build trains several
/// times slower without any other sign. The first strategy a program makes calls
/// warn_if_unoptimised(); setting the environment variable LOCKSTEP_NO_O0_WARNING (to anything
/// but "" or "0") silences it.

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lockstep {

/// True when the translation unit that includes this header was compiled with optimisation
/// (g++, clang++ and nvcc's host compiler define __OPTIMIZE__ from -O1 up).
#if defined(__OPTIMIZE__)
inline constexpr bool compiled_with_optimisation = true;
#else
inline constexpr bool compiled_with_optimisation = false;
#endif

/// The line warn_if_unoptimised prints (without its newline).
inline constexpr const char* unoptimised_warning =
    "lockstep: warning: compiled without optimisation (-O0): training runs several times slower; build with -O2 "
    "or CMAKE_BUILD_TYPE=Release";

/// True when the environment variable LOCKSTEP_NO_O0_WARNING is set to anything but "" or "0".
inline bool unoptimised_warning_silenced() noexcept {
  const char* v = std::getenv("LOCKSTEP_NO_O0_WARNING");
  return v && *v && std::strcmp(v, "0") != 0;
}

/// Prints unoptimised_warning to `out` (stderr by default) the first time it is called in a
/// process when `optimised` is false and the warning is not silenced; does nothing otherwise.
/// Returns true when it printed.
inline bool warn_if_unoptimised(bool optimised = compiled_with_optimisation, std::FILE* out = nullptr) noexcept {
  if (optimised || unoptimised_warning_silenced()) return false;
  // The one piece of process-wide state here, on purpose: the warning is about how the program
  // was built, not about one strategy, so it is printed once per process however many strategies
  // are made (and from whichever thread makes the first). The flag is only ever set, and decides
  // nothing but whether this line is printed again.
  static std::atomic<bool> printed{false};
  if (printed.exchange(true)) return false;
  std::fprintf(out ? out : stderr, "%s\n", unoptimised_warning);
  std::fflush(out ? out : stderr);
  return true;
}

}  // namespace lockstep
