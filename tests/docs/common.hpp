// Helpers of the tests that compile and run the code blocks of README.md and docs/*.md (each page's
// blocks are regions `// example-begin NAME` ... `// example-end` of tests/docs/<page>_test.cpp,
// which the docs_<page> tests compare with the page).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <unistd.h>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace docs_test {

/// n labelled samples of `width` features (labels 0..9), as a dataset.
inline lockstep::data::dataset<lockstep::data::sample> samples(std::size_t n, std::size_t width) {
  std::vector<float> x(n * width);
  std::vector<std::int32_t> y(n);
  const lockstep::counter_rng rng(5, 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i);
  for (std::size_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>(i % 10);
  return lockstep::data::from_memory(std::move(x), width, std::move(y));
}

/// A fresh empty directory, made the current one while it lives (the pages write "ckpt" and
/// "metrics.jsonl" relative to it), removed afterwards.
struct scratch_directory {
  std::filesystem::path path, previous;
  explicit scratch_directory(const std::string& name) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("lockstep_docs_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    previous = std::filesystem::current_path();
    std::filesystem::current_path(path);
  }
  ~scratch_directory() {
    std::error_code ec;
    std::filesystem::current_path(previous, ec);
    std::filesystem::remove_all(path, ec);
  }
  scratch_directory(const scratch_directory&) = delete;
  scratch_directory& operator=(const scratch_directory&) = delete;
};

}  // namespace docs_test
