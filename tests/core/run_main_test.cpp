// Tests of core/run_main.hpp: the report of an escaping exception, its nested causes, and the
// exit code; and of os_reason.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include <lockstep/core/error.hpp>
#include <lockstep/core/run_main.hpp>

namespace ls = lockstep;

namespace {

/// Runs `f` through run_main with the report going to a temporary file; returns {code, report}.
template <class F>
std::pair<int, std::string> run_captured(F&& f, std::string prefix = {}) {
  std::FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int code = ls::run_main(std::forward<F>(f), ls::run_main_options{std::move(prefix), tmp});
  std::rewind(tmp);
  std::string text;
  char buf[256];
  while (const std::size_t n = std::fread(buf, 1, sizeof buf, tmp)) text.append(buf, n);
  std::fclose(tmp);
  return {code, text};
}

}  // namespace

TEST_CASE("run_main: the body's result is the exit code, and nothing is printed") {
  CHECK(run_captured([] { return 0; }) == std::pair<int, std::string>{0, ""});
  CHECK(run_captured([] { return 7; }) == std::pair<int, std::string>{7, ""});
  CHECK(run_captured([] {}) == std::pair<int, std::string>{0, ""});
}

TEST_CASE("run_main: a lockstep::error ends with `error: <what>` and exit code 2, and another exception with 1") {
  auto [code, text] = run_captured([]() -> int { throw ls::data_error("lockstep::data::csv: a.csv:3:2: bad"); });
  CHECK(code == 2);
  CHECK(text == "error: lockstep::data::csv: a.csv:3:2: bad\n");
  std::tie(code, text) = run_captured([]() -> int { throw std::runtime_error("disk on fire"); });
  CHECK(code == 1);
  CHECK(text == "error: disk on fire\n");
  std::tie(code, text) = run_captured([]() -> int { throw 42; });
  CHECK(code == 1);
  CHECK(text == "error: an exception that is not a std::exception\n");
}

TEST_CASE("run_main: every nested cause gets its own line, and the innermost decides the exit code") {
  const auto nested = [](auto inner, auto outer) {
    try {
      throw inner;
    } catch (...) {
      std::throw_with_nested(outer);
    }
  };
  // A replica's bad input: exit code 2, both messages.
  auto [code, text] = run_captured([&] { nested(ls::data_error("bad label"), ls::replica_error("replica 1 failed", 1)); });
  CHECK(code == 2);
  CHECK(text == "error: replica 1 failed\n  caused by: bad label\n");
  // A replica's failure that is not a lockstep::error: exit code 1.
  std::tie(code, text) = run_captured([&] { nested(std::runtime_error("out of paper"), ls::replica_error("replica 0 failed", 0)); });
  CHECK(code == 1);
  CHECK(text == "error: replica 0 failed\n  caused by: out of paper\n");
  // A message that repeats its cause (as a replica_error does) is not printed twice.
  std::tie(code, text) = run_captured([&] {
    nested(ls::data_error("lockstep::data::csv: a.csv:2:1: bad"),
           ls::replica_error("lockstep: replica 1 at step 3 failed: lockstep::data::csv: a.csv:2:1: bad", 1, 3));
  });
  CHECK(code == 2);
  CHECK(text == "error: lockstep: replica 1 at step 3 failed\n  caused by: lockstep::data::csv: a.csv:2:1: bad\n");
  // Three levels, with a prefix on every line.
  std::tie(code, text) = run_captured(
      [&] {
        try {
          nested(ls::config_error("inner"), std::runtime_error("middle"));
        } catch (...) {
          std::throw_with_nested(ls::replica_error("outer", 2));
        }
      },
      "rank 1: ");
  CHECK(code == 2);
  CHECK(text == "rank 1: error: outer\nrank 1:   caused by: middle\nrank 1:   caused by: inner\n");
}

TEST_CASE("run_main: stdout is flushed before the report") {
  // What the body printed reaches its destination even though the program ends with an error.
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  std::FILE* report = std::tmpfile();
  REQUIRE(report != nullptr);
  std::FILE* saved = stdout;
  stdout = out;  // glibc allows assigning the stream pointers
  const int code = ls::run_main([]() -> int {
    std::printf("partial result\n");
    throw ls::config_error("late failure");
  }, ls::run_main_options{{}, report});
  stdout = saved;
  std::fclose(report);
  CHECK(code == 2);
  // Without run_main's flush, the line would still sit in the stream's buffer: read the file
  // through its descriptor, bypassing that buffer.
  std::string text(64, '\0');
  const long n = ::pread(::fileno(out), text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  CHECK(text == "partial result\n");
  std::fclose(out);
}

TEST_CASE("os_reason names the operating system's reason") {
  CHECK(ls::os_reason(ENOENT) == "No such file or directory");
  CHECK(ls::os_reason(EACCES) == "Permission denied");
}
