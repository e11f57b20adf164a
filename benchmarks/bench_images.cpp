// bench_images: JPEG decode + random resized crop + horizontal flip + normalisation per core, the
// augmentation pipeline of ImageNet training, on one thread.
//
//   bench_images --write DIR [--images N] [--side S] [--quality Q]
//       writes N generated S x S JPEG images (default 512, 224, 90) as DIR/NNNNN.jpg with the
//       list file DIR/list.txt ("NNNNN.jpg label" lines), for this program and for
//       benchmarks/peers/tf_images.py to read the same files.
//   bench_images --dir DIR [--epochs E] [--out S]
//       image_folder(DIR) | scale(1/255) | random_resized_crop(S, S) | random_flip |
//       normalize(ImageNet means, stds) | batched(64), each batch cut for one replica and loaded on
//       the calling thread alone (load threads 1, no prefetch): decode only the crop (libjpeg-turbo,
//       accurate integer DCT), one bilinear pass to S x S channels-first, float at the cut. One
//       warm-up epoch, then E timed epochs. Then the same epoch cut for rank 0 of W = 2 and 4
//       workers: the time per global epoch should fall as 1/W. Prints
//         images_samples_per_s=<n> images_decode_share=<f> images_mpix_per_s=<n>
//         workers=<W> rank0_samples=<n> rank0_seconds=<s> seconds_ratio_to_one=<f>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

#include "timing.hpp"

namespace ld = lockstep::data;

namespace {

using clock_type = bench_timing::wall_clock;
using bench_timing::seconds_since;

std::string padded(std::size_t v) {
  const std::string s = std::to_string(v);
  return std::string(s.size() < 5 ? 5 - s.size() : 0, '0') + s;
}

// A photograph-like image: smooth colour fields and edges plus a little noise, so that it
// compresses like a natural image (about 1.5 bits per pixel at quality 90).
std::vector<std::uint8_t> generated(std::uint32_t side, std::size_t seed) {
  std::vector<std::uint8_t> p(std::size_t{side} * side * 3);
  const double a = 0.02 + 0.003 * static_cast<double>(seed % 7), b = 0.015 + 0.002 * static_cast<double>(seed % 5);
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::uint32_t y = 0; y < side; ++y)
    for (std::uint32_t x = 0; x < side; ++x)
      for (std::uint32_t c = 0; c < 3; ++c) {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        const double v = 128 + 70 * std::sin(a * x * (c + 1) + b * y) + 40 * std::cos(0.05 * (x + y) + seed) +
                         (((x / 37 + y / 29 + seed) % 3 == 0) ? 30 : -10) + static_cast<double>(z % 17) - 8;
        p[(std::size_t{y} * side + x) * 3 + c] = static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return p;
}

int write(const std::string& dir, std::size_t n, std::uint32_t side, int quality) {
  std::filesystem::create_directories(dir);
  std::ofstream list(dir + "/list.txt");
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto px = generated(side, i);
    const auto jpg = ld::encode_jpeg(px.data(), side, side, 3, {.quality = quality});
    std::ofstream(dir + "/" + padded(i) + ".jpg", std::ios::binary)
        .write(reinterpret_cast<const char*>(jpg.data()), static_cast<std::streamsize>(jpg.size()));
    list << padded(i) << ".jpg " << i % 1000 << "\n";
    bytes += jpg.size();
  }
  std::printf("images_written=%zu side=%u quality=%d mean_bytes=%zu\n", n, side, quality, bytes / std::max<std::size_t>(n, 1));
  return 0;
}

int measure(const std::string& dir, int epochs, std::uint32_t out) {
  ld::image_folder_options o;
  o.list_file = dir + "/list.txt";
  o.load.threads = 1;  // one core: the calling thread decodes
  const auto src = ld::image_folder(dir, o);
  const auto pipe = src | ld::map(ld::scale(1.0f / 255)) | ld::random_resized_crop(out, out, 1) | ld::random_flip(2) |
                    ld::normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}) | ld::batched(64);
  double checksum = 0;
  const auto run = [&](std::uint64_t epoch, std::size_t workers) {
    std::size_t rows = 0;
    for (auto&& b : pipe.epoch(epoch)) {
      const auto db = ld::detail::make_sharded(std::move(b), workers, 0, 1);
      const ld::shard& s = db.shards[0];
      rows += s.size;
      if (s.size) checksum += s.features[s.size * s.width / 2];
    }
    return rows;
  };
  (void)run(0, 1);  // warm-up: page cache, pools, decoder state
  const auto before = src.report();
  const auto start = clock_type::now();
  std::size_t samples = 0;
  for (int e = 1; e <= epochs; ++e) samples += run(static_cast<std::uint64_t>(e), 1);
  const double t = seconds_since(start);
  const auto after = src.report();
  const double decode = after.decode_s - before.decode_s, read = after.read_s - before.read_s,
               stages = after.augment_s - before.augment_s, stage = after.stage_s - before.stage_s;
  std::printf("images_samples_per_s=%.1f images_mpix_per_s=%.2f images_decode_share=%.3f images_read_share=%.3f "
              "images_stages_share=%.3f images_stage_share=%.3f samples=%zu seconds=%.3f out=%u\n",
              static_cast<double>(samples) / t, static_cast<double>(samples) * out * out / t / 1e6, decode / t, read / t,
              stages / t, stage / t, samples, t, out);
  // Work per worker: rank 0 of W workers decodes 1/W of each global batch.
  double t1 = 0;
  for (std::size_t w : {1, 2, 4}) {
    const auto s0 = clock_type::now();
    const std::size_t rows = run(100 + w, w);
    const double tw = seconds_since(s0);
    if (w == 1) t1 = tw;
    std::printf("workers=%zu rank0_samples=%zu rank0_seconds=%.3f seconds_ratio_to_one=%.3f\n", w, rows, tw, tw / t1);
  }
  std::fprintf(stderr, "%s(checksum %g)\n", src.report().text().c_str(), checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string write_dir, dir;
  std::size_t images = 512;
  std::uint32_t side = 224, out = 224;
  int quality = 90, epochs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool more = i + 1 < argc;
    if (arg == "--write" && more) write_dir = argv[++i];
    else if (arg == "--dir" && more) dir = argv[++i];
    else if (arg == "--images" && more) images = std::strtoul(argv[++i], nullptr, 10);
    else if (arg == "--side" && more) side = static_cast<std::uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else if (arg == "--quality" && more) quality = std::atoi(argv[++i]);
    else if (arg == "--epochs" && more) epochs = std::max(1, std::atoi(argv[++i]));
    else if (arg == "--out" && more) out = static_cast<std::uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    else {
      std::fprintf(stderr, "usage: %s --write DIR [--images N] [--side S] [--quality Q] | --dir DIR [--epochs E] [--out S]\n", argv[0]);
      return 2;
    }
  }
  try {
    if (!write_dir.empty()) return write(write_dir, images, side, quality);
    if (!dir.empty()) return measure(dir, epochs, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: %s --write DIR ... | --dir DIR ...\n", argv[0]);
  return 2;
}
