#pragma once
// Small synthetic problems shared by the training tests.

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <lockstep/data.hpp>
#include <lockstep/lockstep.hpp>

namespace train_test {

/// A fresh, empty directory for one test (named after the test and this process).
inline std::filesystem::path temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("lockstep_train_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d;
}

namespace ls = lockstep;

/// Runs `train()` in a child process that writes checkpoints into `dir` until it is killed: waits
/// (up to 60 s) for the child's first checkpoint, then `delay_us` microseconds more, kills it with
/// SIGKILL and reaps it. True when the child died of that SIGKILL (not of an exception, exit 3, or
/// by returning, exit 4).
template <class Train>
bool killed_while_checkpointing(const std::filesystem::path& dir, std::uint32_t delay_us, Train&& train) {
  const pid_t child = ::fork();
  if (child < 0) return false;
  if (child == 0) {
    try {
      train();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(4);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (ls::checkpoint_manager(dir, 2).list().empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

inline constexpr std::size_t width = 8;    // features per sample
inline constexpr std::size_t classes = 3;  // labels 0..2

using net = ls::sequential<ls::dense<width, 16>, ls::relu, ls::dropout<1, 4>, ls::dense<16, classes>>;

/// `n` samples of three noisy clusters (deterministic).
struct blobs {
  std::vector<float> features;
  std::vector<std::int32_t> labels;
};
inline blobs make_blobs(std::size_t n, std::uint64_t seed = 1) {
  const ls::counter_rng rng(seed, 99);
  blobs b;
  for (std::size_t i = 0; i < n; ++i) {
    const auto label = static_cast<std::int32_t>(rng.u32(4 * i) % classes);
    b.labels.push_back(label);
    for (std::size_t j = 0; j < width; ++j)
      b.features.push_back(static_cast<float>((j % classes == static_cast<std::size_t>(label) ? 1.5 : 0.0) +
                                              0.7 * rng.normal(1000 + i * width + j)));
  }
  return b;
}

/// A shuffled, batched pipeline over `n` samples.
inline auto pipeline(std::size_t n, std::size_t batch, std::uint64_t shuffle_seed = 5) {
  blobs b = make_blobs(n);
  return ls::data::from_memory(std::move(b.features), width, std::move(b.labels)) |
         ls::data::shuffle(n ? n : 1, shuffle_seed) | ls::data::batched(batch);
}

/// An unshuffled pipeline (for evaluation).
inline auto eval_pipeline(std::size_t n, std::size_t batch, std::uint64_t seed = 2) {
  blobs b = make_blobs(n, seed);
  return ls::data::from_memory(std::move(b.features), width, std::move(b.labels)) | ls::data::batched(batch);
}

template <class M>
std::vector<float> params_of(M& m) {
  return m.parameters_to_host();
}

}  // namespace train_test
