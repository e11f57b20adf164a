// Tests of core/labels.hpp (check_labels: the one label check and message of every device) and
// core/build_check.hpp (the warning of a program compiled without optimisation).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <lockstep/core/build_check.hpp>
#include <lockstep/core/labels.hpp>

namespace ls = lockstep;

namespace {
std::string message_of(const std::vector<std::int32_t>& labels, std::size_t classes, const ls::label_site& site) {
  try {
    ls::check_labels("lockstep::softmax_cross_entropy", labels.data(), labels.size(), classes, classes, site);
  } catch (const ls::data_error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("check_labels: names the label, the sample, the row, the replica, the step and the bound") {
  const std::vector<std::int32_t> labels = {0, 4, 2, 9, 1};
  const std::vector<std::uint64_t> indices = {17, 5, 60, 41, 3};
  CHECK(message_of(labels, 5, {indices.data(), 0, 0}) ==
        "lockstep::softmax_cross_entropy: label 9 of sample 41 (row 3 of replica 0's shard at step 0) is outside "
        "[0, 5): the model has 5 outputs");
  // What the site does not know is left out.
  CHECK(message_of(labels, 5, {}) ==
        "lockstep::softmax_cross_entropy: label 9 (row 3) is outside [0, 5): the model has 5 outputs");
  CHECK(message_of(labels, 5, {indices.data()}) ==
        "lockstep::softmax_cross_entropy: label 9 of sample 41 (row 3) is outside [0, 5): the model has 5 outputs");
  CHECK(message_of(labels, 5, {nullptr, 2, 1234}) ==
        "lockstep::softmax_cross_entropy: label 9 (row 3 of replica 2's shard at step 1234) is outside [0, 5): the "
        "model has 5 outputs");
  // One output: singular.
  CHECK(message_of({0, 1}, 1, {}) == "lockstep::softmax_cross_entropy: label 1 (row 1) is outside [0, 1): the model has 1 output");
}

TEST_CASE("check_labels: the first bad label is named, whatever its value and position") {
  const std::int32_t extremes[] = {-1, -7, std::numeric_limits<std::int32_t>::min(), 10, 11,
                                   std::numeric_limits<std::int32_t>::max()};
  for (const std::size_t rows : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{64}, std::size_t{1031}}) {
    for (const std::int32_t bad : extremes) {
      for (const std::size_t at : {std::size_t{0}, rows / 2, rows - 1}) {
        CAPTURE(rows);
        CAPTURE(bad);
        CAPTURE(at);
        std::vector<std::int32_t> labels(rows);
        for (std::size_t i = 0; i < rows; ++i) labels[i] = static_cast<std::int32_t>(i % 10);
        labels[at] = bad;
        if (at + 1 < rows) labels[rows - 1] = 12;  // a later bad label is not the one named
        const std::string msg = message_of(labels, 10, {});
        CHECK(msg == "lockstep::softmax_cross_entropy: label " + std::to_string(bad) + " (row " + std::to_string(at) +
                         ") is outside [0, 10): the model has 10 outputs");
      }
    }
  }
}

TEST_CASE("check_labels: good labels, no labels and no rows pass") {
  for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000}}) {
    std::vector<std::int32_t> labels(rows);
    for (std::size_t i = 0; i < rows; ++i) labels[i] = static_cast<std::int32_t>((i * 7) % 10);
    CHECK_NOTHROW(ls::check_labels("x", labels.data(), rows, 10, 10));
  }
  CHECK_NOTHROW(ls::check_labels("x", nullptr, 5, 10, 10));
}

TEST_CASE("warn_if_unoptimised: prints the warning once per process, only for an unoptimised build") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  ::unsetenv("LOCKSTEP_NO_O0_WARNING");
  CHECK_FALSE(ls::warn_if_unoptimised(true, out));  // optimised: nothing
  CHECK(ls::warn_if_unoptimised(false, out));       // the first unoptimised call prints
  CHECK_FALSE(ls::warn_if_unoptimised(false, out)); // and no other
  std::rewind(out);
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, out);
  std::fclose(out);
  CHECK(std::string(buf, n) ==
        "lockstep: warning: compiled without optimisation (-O0): training runs several times slower; build with -O2 or "
        "CMAKE_BUILD_TYPE=Release\n");
}

TEST_CASE("warn_if_unoptimised: LOCKSTEP_NO_O0_WARNING silences it") {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  ::setenv("LOCKSTEP_NO_O0_WARNING", "1", 1);
  CHECK(ls::unoptimised_warning_silenced());
  CHECK_FALSE(ls::warn_if_unoptimised(false, out));
  ::setenv("LOCKSTEP_NO_O0_WARNING", "0", 1);  // "0" does not silence it
  CHECK_FALSE(ls::unoptimised_warning_silenced());
  ::unsetenv("LOCKSTEP_NO_O0_WARNING");
  CHECK(std::ftell(out) == 0);
  std::fclose(out);
}
