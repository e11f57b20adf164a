// The example of docs/data.md, compiled and run (on synthetic data when Fashion-MNIST is absent).
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <lockstep/data.hpp>

namespace {

// example-begin data-pipeline
namespace ld = lockstep::data;

ld::dataset<ld::distributed_batch> make_train(const ld::dataset<ld::sample>& source, std::uint64_t seed) {
  return source
       | ld::map(ld::scale(1.0f / 255))   // uint8 pixels -> [0, 1], fused into batch assembly
       | ld::shuffle(60'000, seed)        // tf.data buffer semantics, order from (seed, epoch)
       | ld::batched(256)                 // the GLOBAL batch (pooled_batch, a lockstep::data::batch)
       | ld::shard_batches(2)             // one shard per replica
       | ld::prefetch(2);                 // producer thread, 2 steps ahead
}

std::size_t train_epochs(const ld::dataset<ld::distributed_batch>& train, int epochs) {
  std::size_t samples = 0;
  for (int e = 0; e < epochs; ++e)
    for (auto&& step : train.epoch(static_cast<std::uint64_t>(e)))  // a new order every epoch
      for (const ld::shard& s : step.shards)                          // replica r gets step.shards[r]
        samples += s.size;  // s.features, s.labels, s.indices: s.size rows of s.width
  return samples;
}
// example-end data-pipeline

}  // namespace

TEST_CASE("docs/data.md example") {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  ld::dataset<ld::sample> source;
  std::size_t n = 0;
  if (std::filesystem::exists(dir + "t10k-images-idx3-ubyte.gz")) {
    source = ld::idx(dir + "t10k-images-idx3-ubyte.gz", dir + "t10k-labels-idx1-ubyte.gz");
    n = 10'000;
  } else {
    n = 1'000;
    source = ld::from_memory(std::vector<std::uint8_t>(n * 784, 7), 784, std::vector<std::int32_t>(n, 1));
  }
  CHECK(train_epochs(make_train(source, 7), 2) == 2 * n);
}
