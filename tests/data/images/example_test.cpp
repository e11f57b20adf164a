// The index-first example of docs/data.md, compiled and run on a small generated image folder.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

#include "data/images/fashion.hpp"

namespace {

// example-begin index-first
namespace ld = lockstep::data;

// ImageNet-style training data: a class per subfolder of `root`, JPEG or PNG files.
ld::dataset<ld::index_batch> imagenet_train(const std::string& root, std::uint64_t seed) {
  return ld::image_folder(root, {.load = {.threads = 8}})       // lists and sorts the files; opens none
       | ld::map(ld::scale(1.0f / 255))                        // recorded, applied when rows become float
       | ld::random_resized_crop(224, 224, seed)               // keyed by (seed, epoch, sample index)
       | ld::random_flip(seed + 1)
       | ld::normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f})
       | ld::shuffle(1'281'167, seed)                          // a permutation of indices, not of images
       | ld::batched(256)                                      // index batches: nothing decoded yet
       | ld::prefetch(2);                                      // decodes this process's rows ahead
}
// fit(strategy, model, opt, loss, imagenet_train(root, 7), ...) cuts every batch with the strategy's
// shard plan: each worker reads and decodes only the rows of its own replicas.
// example-end index-first

}  // namespace

TEST_CASE("docs/data.md: the index-first example runs") {
  fashion_test::scratch_dir dir;
  const std::size_t n = 300;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::uint8_t> px(40 * 30 * 3);
    for (std::size_t k = 0; k < px.size(); ++k) px[k] = static_cast<std::uint8_t>(i * 7 + k);
    const auto jpg = ld::encode_jpeg(px.data(), 40, 30, 3);
    const auto cls = std::filesystem::path(dir.path()) / ("class" + std::to_string(i % 3));
    std::filesystem::create_directories(cls);
    std::ofstream(cls / (fashion_test::key(i) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(jpg.data()), static_cast<std::streamsize>(jpg.size()));
  }
  const auto train = imagenet_train(dir.path(), 7);
  std::size_t rows = 0;
  for (auto&& b : train.epoch(0)) {
    const auto db = ld::detail::make_sharded(std::move(b), 4, 2, 2);  // worker 1 of 2, 2 replicas each
    for (const auto& s : db.shards) {
      CHECK((s.size == 0 || s.width == 3 * 224 * 224));
      rows += s.size;
    }
  }
  CHECK(rows == n / 2);
}
