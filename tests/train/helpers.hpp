#pragma once
// Small synthetic problems shared by the training tests.

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

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
