// Fashion-MNIST written as a PNG folder and as tar shards: batches bitwise equal to the IDX
// source's (shuffle on and off; 1, 2 and 3 replicas); a cut loads exactly the rows of its shards
// and reads about their share of the bytes; a resume at batch 100 opens no file of batches 0-99;
// three epochs over a folder of 20 000 images do not grow the memory after the first.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

#include "data/images/fashion.hpp"
#include "support/sanitizers.hpp"

namespace ld = lockstep::data;

namespace {

// The data set written once for all test cases of this program.
struct fashion_data {
  fashion_test::scratch_dir dir;
  std::shared_ptr<const ld::table> table = fashion_test::idx_table("train");
  fashion_test::files files = fashion_test::write(*table, dir.path(), "train", 6);
};

const fashion_data& data() {
  static const fashion_data d;
  return d;
}

bool same_shard(const ld::shard& a, const ld::shard& b) {
  if (a.size != b.size || a.offset != b.offset || a.width != b.width || a.global_size != b.global_size) return false;
  return a.size == 0 || (std::memcmp(a.features, b.features, a.size * a.width * sizeof(float)) == 0 &&
                         std::memcmp(a.labels, b.labels, a.size * sizeof(std::int32_t)) == 0 &&
                         std::memcmp(a.indices, b.indices, a.size * sizeof(std::uint64_t)) == 0);
}

std::size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

TEST_CASE("fashion-mnist: PNG folder and tar shards give the IDX source's batches, bit for bit" * doctest::timeout(600)) {
  if (!fashion_test::available()) {
    MESSAGE("Fashion-MNIST not installed (Debian package dataset-fashion-mnist): skipped");
    return;
  }
  const auto& d = data();
  const auto folder = ld::image_folder(d.files.folder, {.image = {.channels = 1}, .list_file = d.files.list, .load = {.threads = 2}});
  const auto tars = ld::tar_shards(d.files.shards, {.image = {.channels = 1}, .load = {.threads = 2}});
  REQUIRE(folder.size() == 60000);
  REQUIRE(tars.size() == 60000);
  for (bool shuffled : {false, true}) {
    const std::size_t buffer = shuffled ? 60000 : 1;
    const auto idx = ld::from_table(d.table) | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(buffer, 7) | ld::batched(256);
    for (const ld::indexed_dataset* src : {&folder, &tars})
      for (std::size_t replicas = 1; replicas <= 3; ++replicas) {
        CAPTURE(shuffled);
        CAPTURE(src->source().describe());
        CAPTURE(replicas);
        const auto pipe = *src | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(buffer, 7) | ld::batched(256) | ld::prefetch(2);
        auto want = idx.epoch(3);
        auto it = want.begin();
        std::size_t batches = 0, bad = 0;
        for (auto&& b : pipe.epoch(3)) {
          REQUIRE(it != want.end());
          const auto got = ld::detail::make_sharded(std::move(b), replicas);
          const auto exp = ld::detail::make_sharded(std::move(*it), replicas);
          for (std::size_t r = 0; r < replicas; ++r) bad += !same_shard(got.shards[r], exp.shards[r]);
          ++it;
          ++batches;
        }
        CHECK(it == want.end());
        CHECK(batches == 235);
        CHECK(bad == 0);
      }
  }
  MESSAGE(folder.report().text());
  MESSAGE(tars.report().text());
}

TEST_CASE("fashion-mnist: a worker's cut loads exactly its rows and reads about half the bytes" * doctest::timeout(300)) {
  if (!fashion_test::available()) return;
  const auto& d = data();
  for (int format = 0; format < 2; ++format)
    for (std::size_t rank = 0; rank < 2; ++rank) {
      CAPTURE(format);
      CAPTURE(rank);
      const auto src = format == 0 ? ld::image_folder(d.files.folder, {.image = {.channels = 1}, .list_file = d.files.list})
                                   : ld::tar_shards(d.files.shards, {.image = {.channels = 1}});
      const auto pipe = src | ld::shuffle(60000, 3) | ld::batched(256) | ld::prefetch(2);
      std::size_t rows = 0;
      for (auto&& b : pipe.epoch(0)) {
        const auto db = ld::detail::make_sharded(std::move(b), 2, rank, 1);  // 2 workers x 1 replica
        rows += db.shards[0].size;
      }
      const auto rep = src.report();
      CHECK(rows == 30000);
      CHECK(rep.samples == rows);  // exactly the kept rows were decoded
      const double share = static_cast<double>(rep.bytes_read) /
                           static_cast<double>(format == 0 ? d.files.folder_bytes : d.files.member_bytes);
      CHECK(share <= 0.55);
      CHECK(share >= 0.45);
      MESSAGE((format == 0 ? "png folder" : "tar shards") << ", worker " << rank << " of 2: decoded " << rep.samples
                                                          << " samples, read " << share * 100 << "% of the sample bytes ("
                                                          << rep.bytes_read << "), index bytes " << rep.index_bytes);
    }
}

TEST_CASE("fashion-mnist: a resume at batch 100 opens no file of batches 0-99" * doctest::timeout(300)) {
  if (!fashion_test::available()) return;
  const auto& d = data();
  std::mutex m;
  std::set<std::string> opened;
  const auto src = ld::image_folder(d.files.folder, {.image = {.channels = 1},
                                                     .list_file = d.files.list,
                                                     .load = {.threads = 2},
                                                     .on_open = [&](const std::string& p) {
                                                       std::lock_guard lock(m);
                                                       opened.insert(p);
                                                     }});
  const auto pipe = src | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(60000, 11) | ld::batched(256) | ld::prefetch(2);
  std::set<std::string> early;
  std::size_t k = 0, kept = 0;
  for (auto&& b : pipe.epoch(5)) {
    if (k++ < 100) {  // consumed before the checkpoint: fit skips them without cutting
      for (auto i : b.indices) early.insert(d.files.folder + "/" + fashion_test::key(i) + ".png");
      continue;
    }
    kept += ld::detail::make_sharded(std::move(b), 2).global_size();
  }
  CHECK(early.size() == 25600);
  CHECK(kept == 60000 - 25600);
  CHECK(opened.size() == kept);
  std::size_t overlap = 0;
  for (const auto& p : opened) overlap += early.count(p);
  CHECK(overlap == 0);
  CHECK(src.report().opens == kept);
}

TEST_CASE("images: three epochs over 20 000 images do not grow the memory after the first" * doctest::timeout(300)) {
  fashion_test::scratch_dir dir;
  const std::size_t n = 20000;
  std::ofstream list(dir.path() + "/list.txt");
  std::vector<std::uint8_t> px(16 * 16 * 3);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < px.size(); ++k) px[k] = static_cast<std::uint8_t>((i * 131 + k * 7) >> 2);
    const auto png = ld::encode_png(px.data(), 16, 16, 3, 1);
    const std::string name = fashion_test::key(i) + ".png";
    std::ofstream(dir.path() + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(png.data()),
                                                                  static_cast<std::streamsize>(png.size()));
    list << name << " " << i % 10 << "\n";
  }
  list.close();
  const auto src = ld::image_folder(dir.path(), {.list_file = dir.path() + "/list.txt", .load = {.threads = 2}});
  const auto pipe = src | ld::map(ld::scale(1.0f / 255)) | ld::random_resized_crop(12, 12, 1) | ld::random_flip(2) |
                    ld::normalize({0.5f, 0.5f, 0.5f}, {0.25f, 0.25f, 0.25f}) | ld::shuffle(n, 3) | ld::batched(128) |
                    ld::prefetch(2);
  std::vector<std::size_t> rss;
  for (std::uint64_t e = 0; e < 3; ++e) {
    std::size_t rows = 0;
    for (auto&& b : pipe.epoch(e)) rows += ld::detail::make_sharded(std::move(b), 2).global_size();
    CHECK(rows == n);
    rss.push_back(resident_bytes());
  }
  const auto rep = src.report();
  MESSAGE("resident MiB after epochs 1, 2, 3: " << rss[0] / 1048576.0 << ", " << rss[1] / 1048576.0 << ", "
                                                 << rss[2] / 1048576.0 << "\n"
                                                 << rep.text());
  if constexpr (test_support::address_sanitizer)  // freed blocks wait in ASan's quarantine, so memory grows
    MESSAGE("resident memory not compared: built with AddressSanitizer");
  else
    CHECK(rss[2] <= rss[0] + (1u << 20));  // no growth after the first epoch (1 MiB of slack)
  // Decoded-row buffers in flight: at most prefetch depth + 2 decoded batches (see indexed.hpp).
  CHECK(rep.peak_row_buffer_bytes <= (2 + 2) * rep.decoded_batch_bytes);
  CHECK(rep.samples == 3 * n);
}
