#pragma once
/// @file run_main.hpp
/// `run_main(body)`: the clean end of a program. It runs `body`, and when an exception escapes it
/// flushes stdout, prints `error: <what>` and then each nested cause on its own line
/// (`  caused by: <what>`) to stderr, and returns the exit code: 2 when the innermost cause is a
/// `lockstep::error` (bad input, a bad option, a corrupt checkpoint: something the user can fix),
/// 1 for any other exception. Nothing is lost from a redirected stdout, and no uncaught exception
/// ends the program with `terminate called ...` and exit code 134.
///
///     int main(int argc, char** argv) {
///       return lockstep::run_main([&] { /* the program */ });
///     }

#include <cstdio>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/core/error.hpp>

namespace lockstep {

/// How run_main reports a failure.
struct run_main_options {
  std::string prefix{};          ///< put before every line it prints (for example "rank 3: " under MPI)
  std::FILE* stream = nullptr;   ///< where the report goes (nullptr: stderr)
};

namespace detail {

/// Calls `f(level)` for `e` and then for each exception nested in it (std::nested_exception),
/// outermost first; `level` is null for a nested exception that is not a std::exception, which
/// ends the chain. Each level is rethrown once and caught by reference while `f` sees it.
template <class F>
void for_each_nested(const std::exception& e, F&& f) {
  f(&e);
  const std::exception* current = &e;
  std::exception_ptr keep;  // holds the level being examined
  while (const auto* nested = dynamic_cast<const std::nested_exception*>(current)) {
    keep = nested->nested_ptr();
    if (!keep) return;
    try {
      std::rethrow_exception(keep);
    } catch (const std::exception& inner) {
      f(&inner);
      current = &inner;
      continue;
    } catch (...) {
      f(nullptr);
    }
    return;
  }
}

}  // namespace detail

/// The report of exception `e`: `error: <what>`, then one `  caused by: <what>` line for each
/// exception nested in it (std::nested_exception, as a replica_error carries the replica's
/// failure), innermost last. A message that ends with the message of the exception nested in it
/// (a replica_error repeats its cause) is shown without that repetition. Every line ends with a
/// newline and starts with `prefix`.
inline std::string error_report(const std::exception& e, const std::string& prefix = {}) {
  std::vector<std::string> chain;
  detail::for_each_nested(e, [&](const std::exception* level) {
    chain.emplace_back(level ? level->what() : "an exception that is not a std::exception");
  });
  std::string out;
  for (std::size_t i = 0; i < chain.size(); ++i) {
    std::string line = chain[i];
    if (i + 1 < chain.size()) {
      const std::string& next = chain[i + 1];
      if (line.size() > next.size() && line.compare(line.size() - next.size(), next.size(), next) == 0) {
        line.resize(line.size() - next.size());
        while (!line.empty() && (line.back() == ' ' || line.back() == ':')) line.pop_back();
      }
    }
    out += prefix + (i == 0 ? "error: " : "  caused by: ") + line + "\n";
  }
  return out;
}

/// The exit code run_main returns for exception `e`: 2 when the innermost exception nested in it
/// (or `e` itself) is a lockstep::error, else 1.
inline int exit_code_of(const std::exception& e) {
  bool lockstep_error = false;
  detail::for_each_nested(e, [&](const std::exception* level) {
    lockstep_error = level != nullptr && dynamic_cast<const lockstep::error*>(level) != nullptr;
  });
  return lockstep_error ? 2 : 1;
}

/// Runs `body()` (returning int, the exit code, or void, meaning 0). An exception that escapes it
/// is reported as error_report says, after stdout is flushed, and the result is exit_code_of it
/// (1 for an exception that is not a std::exception).
template <class F>
int run_main(F&& body, const run_main_options& options = {}) noexcept {
  std::FILE* out = options.stream ? options.stream : stderr;
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F&>>) {
      body();
      return 0;
    } else {
      return static_cast<int>(body());
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    try {
      std::fputs(error_report(e, options.prefix).c_str(), out);
    } catch (...) {  // no memory for the report: the first line still goes out
      std::fputs("error: ", out);
      std::fputs(e.what(), out);
      std::fputs("\n", out);
    }
    std::fflush(out);
    return exit_code_of(e);
  } catch (...) {
    std::fflush(stdout);
    std::fputs((options.prefix + "error: an exception that is not a std::exception\n").c_str(), out);
    std::fflush(out);
    return 1;
  }
}

}  // namespace lockstep
