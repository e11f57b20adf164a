// bench_pipeline: throughput of the input pipeline on the Fashion-MNIST training set.
//
// decode (once, not timed) -> scale(1/255) -> shuffle(60000) -> batched(256) -> shard_batches(2)
// -> prefetch(2), a few epochs, against memcpy bandwidth measured in the same run. Prints one line:
//   pipeline_samples_per_s=<n> pipeline_gb_per_s=<n> memcpy_gb_per_s=<n>
// where pipeline bytes are the sample bytes delivered (784 * 4 feature bytes + a 4-byte label).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <lockstep/data.hpp>

#include "timing.hpp"

namespace {

using clock_type = bench_timing::wall_clock;
using bench_timing::seconds_since;

// Best of several copies of a large buffer (allocated and touched before timing).
double memcpy_gb_per_s() { return bench_timing::memcpy_gb_per_s(std::size_t{128} << 20); }

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  int epochs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--data" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg == "--epochs" && i + 1 < argc) {
      epochs = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--data DIR] [--epochs N]\n", argv[0]);
      return 2;
    }
  }
  namespace ld = lockstep::data;
  try {
    const auto train = ld::idx(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz") |
                       ld::map(ld::scale(1.0f / 255)) | ld::shuffle(60'000, 7) | ld::batched(256) |
                       ld::shard_batches(2) | ld::prefetch(2);

    double checksum = 0;
    auto run_epoch = [&](std::uint64_t e) {
      std::size_t samples = 0;
      for (auto&& step : train.epoch(e)) {
        samples += step.global_size();
        for (const ld::shard& s : step.shards)
          if (s.size) checksum += static_cast<double>(s.features[0]) + s.labels[s.size - 1];
      }
      return samples;
    };
    run_epoch(0);  // warm-up: pools and buffers reach their steady state

    std::size_t samples = 0;
    const auto start = clock_type::now();
    for (int e = 1; e <= epochs; ++e) samples += run_epoch(static_cast<std::uint64_t>(e));
    const double elapsed = seconds_since(start);

    const double per_sample_bytes = 784.0 * sizeof(float) + sizeof(std::int32_t);
    const double samples_per_s = static_cast<double>(samples) / elapsed;
    const double memcpy_bw = memcpy_gb_per_s();
    std::printf("pipeline_samples_per_s=%.0f pipeline_gb_per_s=%.3f memcpy_gb_per_s=%.3f\n", samples_per_s,
                samples_per_s * per_sample_bytes / 1e9, memcpy_bw);
    if (checksum < 0) std::printf("checksum %f\n", checksum);  // keeps the consumer's reads alive
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
  return 0;
}
