// Index-first batches through fit: training from a PNG folder is bitwise the training from the same
// pixels decoded in memory, and a resume from a checkpoint opens no file of the batches it skips.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>
#include <lockstep/lockstep.hpp>

#include "data/images/fashion.hpp"

namespace ls = lockstep;
namespace ld = lockstep::data;

namespace {

constexpr std::size_t n = 45, batch = 8, side = 4;  // 6 steps per epoch, the last one uneven
using net = ls::sequential<ls::dense<side * side, 12>, ls::relu, ls::dense<12, 3>>;

// n grey side x side images (labels i % 3, pixels brighter in the label's third) and their table.
struct images {
  fashion_test::scratch_dir dir;
  std::shared_ptr<ld::table> table = std::make_shared<ld::table>();
  images() {
    table->rows = n;
    table->width = side * side;
    std::ofstream list(dir.path() + "/list.txt");
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::uint8_t> px(side * side);
      for (std::size_t k = 0; k < px.size(); ++k)
        px[k] = static_cast<std::uint8_t>((k * 3 / px.size() == i % 3 ? 150 : 20) + (i * 37 + k * 11) % 60);
      table->bytes.insert(table->bytes.end(), px.begin(), px.end());
      table->labels.push_back(static_cast<std::int32_t>(i % 3));
      const auto png = ld::encode_png(px.data(), side, side, 1);
      std::ofstream(dir.path() + "/" + fashion_test::key(i) + ".png", std::ios::binary)
          .write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
      list << fashion_test::key(i) << ".png " << i % 3 << "\n";
    }
  }
  ld::indexed_dataset folder(std::function<void(const std::string&)> on_open = {}) const {
    ld::image_folder_options o;
    o.image.channels = 1;
    o.list_file = dir.path() + "/list.txt";
    o.on_open = std::move(on_open);
    return ld::image_folder(dir.path(), o);
  }
};

template <class Train>
std::vector<float> train(const Train& data, const ls::fit_options& o) {
  ls::mirrored<ls::cpus> s(ls::device_selection::first(2));
  auto m = s.replicate<net>(ls::seed{3});
  (void)ls::fit(s, m, ls::adamw{.lr = 1e-2f}, ls::softmax_cross_entropy{}, data, o);
  return m.parameters_to_host();
}

}  // namespace

TEST_CASE("fit: training from a PNG folder, index first, is bitwise the training from the decoded pixels") {
  const images im;
  ls::fit_options o;
  o.epochs = 3;
  o.quiet = true;
  const auto want = train(ld::from_table(im.table) | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(n, 9) | ld::batched(batch), o);
  const auto folder = im.folder();
  const auto got = train(folder | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(n, 9) | ld::batched(batch) | ld::prefetch(2), o);
  CHECK(got == want);
  CHECK(folder.report().samples == 3 * n);  // each sample decoded once per epoch
  // Evaluation over an index-first source: every sample exactly once.
  ls::mirrored<ls::cpus> s(ls::device_selection::first(2));
  auto m = s.replicate<net>(ls::seed{3});
  const auto e = ls::evaluate(s, m, ls::softmax_cross_entropy{}, im.folder() | ld::map(ld::scale(1.0f / 255)) | ld::batched(7));
  CHECK(e.samples == n);
}

TEST_CASE("fit: a resume from a checkpoint opens no file of the batches it skips") {
  const images im;
  const auto dir = std::filesystem::path(im.dir.path()) / "checkpoints";
  const auto pipe = [&](const ld::indexed_dataset& src) {
    return src | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(n, 4) | ld::batched(batch) | ld::prefetch(2);
  };
  ls::fit_options o;
  o.epochs = 100;
  o.quiet = true;
  o.max_steps = 6;  // epoch 0 (every file appears once in it)
  const auto uninterrupted = train(pipe(im.folder()), o);
  // 4 steps with checkpoints, then a restart to 6.
  o.checkpoint_dir = dir.string();
  o.checkpoint_every = 1;
  o.max_steps = 4;
  (void)train(pipe(im.folder()), o);
  std::mutex mutex;
  std::set<std::string> opened;
  const auto folder = im.folder([&](const std::string& p) {
    std::lock_guard lock(mutex);
    opened.insert(std::filesystem::path(p).filename().string());
  });
  o.resume = true;
  o.max_steps = 6;
  const auto resumed = train(pipe(folder), o);
  CHECK(resumed == uninterrupted);
  // Steps 0-3 were batches 0-3 of epoch 0: the resumed run opened the files of batches 4 and 5 only.
  std::set<std::string> skipped, rest;
  std::size_t k = 0;
  for (auto&& b : (ld::indexed(im.table) | ld::shuffle(n, 4) | ld::batched(batch)).epoch(0)) {
    auto& into = k++ < 4 ? skipped : rest;
    for (auto i : b.indices) into.insert(fashion_test::key(i) + ".png");
  }
  CHECK(skipped.size() == 4 * batch);
  CHECK(rest.size() == n - 4 * batch);
  CHECK(opened == rest);
  CHECK(folder.report().samples == n - 4 * batch);
}
