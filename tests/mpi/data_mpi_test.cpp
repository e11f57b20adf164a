// The index-first input pipeline under mpirun -np 2: every worker runs the same pipeline over
// Fashion-MNIST written as a PNG folder and as tar shards, cuts each global batch with the shard
// plan of the multi-worker strategy (parts = workers x replicas, first = rank x replicas), and gets
// the IDX source's shards bit for bit; it decodes exactly its rows (half of each epoch, within a
// batch), each sample is decoded by exactly one worker, and it reads about half of the sample
// bytes (with shards of larger images, of all the bytes, headers included).
#include <doctest/doctest.h>

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

#include "data/images/fashion.hpp"

namespace ld = lockstep::data;

namespace {

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_of() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A folder made by rank 0 and seen by every rank (one machine: /dev/shm or /tmp); removed by rank 0.
struct shared_dir {
  std::unique_ptr<fashion_test::scratch_dir> owned;
  std::string path;
  shared_dir() {
    char buf[256] = {};
    if (rank_of() == 0) {
      owned = std::make_unique<fashion_test::scratch_dir>();
      std::snprintf(buf, sizeof buf, "%s", owned->path().c_str());
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
  }
  ~shared_dir() { MPI_Barrier(MPI_COMM_WORLD); }  // nobody reads while rank 0 removes it
};

struct fashion_data {
  shared_dir dir;
  std::shared_ptr<const ld::table> table = fashion_test::idx_table("train");
  fashion_test::files files;
  fashion_data() {
    if (rank_of() == 0) files = fashion_test::write(*table, dir.path, "train", 6);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_of() != 0) {  // the same names; the sizes are rank 0's business
      files.folder = dir.path + "/train";
      files.list = dir.path + "/train.txt";
      for (int s = 0; s < 6; ++s) files.shards.push_back(dir.path + "/train-00000" + std::to_string(s) + ".tar");
    }
    std::uint64_t sizes[3] = {files.folder_bytes, files.tar_bytes, files.member_bytes};
    MPI_Bcast(sizes, 3, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    files.folder_bytes = sizes[0];
    files.tar_bytes = sizes[1];
    files.member_bytes = sizes[2];
  }
};

bool same_shard(const ld::shard& a, const ld::shard& b) {
  if (a.size != b.size || a.offset != b.offset || a.width != b.width || a.global_size != b.global_size) return false;
  return a.size == 0 || (std::memcmp(a.features, b.features, a.size * a.width * sizeof(float)) == 0 &&
                         std::memcmp(a.labels, b.labels, a.size * sizeof(std::int32_t)) == 0 &&
                         std::memcmp(a.indices, b.indices, a.size * sizeof(std::uint64_t)) == 0);
}

std::uint64_t sum_over_ranks(std::uint64_t v) {
  std::uint64_t s = 0;
  MPI_Allreduce(&v, &s, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return s;
}

}  // namespace

TEST_CASE("mpi data: each worker's shards of the PNG folder and the tar shards are the IDX source's, bit for bit"
          * doctest::timeout(600)) {
  if (!fashion_test::available()) {
    MESSAGE("Fashion-MNIST not installed (dataset-fashion-mnist): skipped");
    return;
  }
  const fashion_data d;
  const std::size_t rank = static_cast<std::size_t>(rank_of()), workers = static_cast<std::size_t>(world_of());
  const std::size_t n = 60000, batch = 256;
  for (int format = 0; format < 2; ++format)
    for (bool shuffled : {false, true})
      for (std::size_t replicas = 1; replicas <= 3; ++replicas) {
        CAPTURE(format);
        CAPTURE(shuffled);
        CAPTURE(replicas);
        std::mutex m;
        std::vector<std::uint8_t> decoded(n, 0);  // which samples this worker opened
        const auto on_open = [&](const std::string& p) {
          const auto name = std::filesystem::path(p).stem().string();
          std::lock_guard lock(m);
          ++decoded[std::stoul(name)];
        };
        const auto on_read = [&](const std::string&, const std::string& member) {
          if (member.ends_with(".png")) on_open(member);
        };
        const auto src = format == 0 ? ld::image_folder(d.files.folder, {.image = {.channels = 1},
                                                                          .list_file = d.files.list,
                                                                          .load = {.threads = 1},
                                                                          .on_open = on_open})
                                     : ld::tar_shards(d.files.shards, {.image = {.channels = 1}, .load = {.threads = 1}, .on_read = on_read});
        const std::size_t buffer = shuffled ? n : 1;
        const auto pipe = src | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(buffer, 17) | ld::batched(batch) | ld::prefetch(2);
        const auto idx = ld::from_table(d.table) | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(buffer, 17) | ld::batched(batch);
        // The plan of multi_worker_mirrored with `replicas` local replicas.
        const std::size_t parts = workers * replicas, first = rank * replicas;
        auto want = idx.epoch(1);
        auto it = want.begin();
        std::size_t bad = 0, rows = 0;
        for (auto&& b : pipe.epoch(1)) {
          REQUIRE(it != want.end());
          const auto got = ld::detail::make_sharded(std::move(b), parts, first, replicas);
          const auto exp = ld::detail::make_sharded(std::move(*it), parts, first, replicas);
          for (std::size_t r = 0; r < replicas; ++r) {
            bad += !same_shard(got.shards[r], exp.shards[r]);
            rows += got.shards[r].size;
          }
          ++it;
        }
        CHECK(it == want.end());
        CHECK(bad == 0);
        const auto rep = src.report();
        // Exactly its rows: half of the epoch, within one batch.
        CHECK(rep.samples == rows);
        CHECK(rep.samples + batch >= n / workers);
        CHECK(rep.samples <= n / workers + batch);
        // Each sample by exactly one worker.
        std::vector<std::uint8_t> all(n, 0);
        MPI_Allreduce(decoded.data(), all.data(), static_cast<int>(n), MPI_UINT8_T, MPI_SUM, MPI_COMM_WORLD);
        CHECK(std::all_of(all.begin(), all.end(), [](std::uint8_t c) { return c == 1; }));
        CHECK(sum_over_ranks(rep.samples) == n);
        // Bytes: about its share of the sample bytes.
        const double share = static_cast<double>(rep.bytes_read) / static_cast<double>(format == 0 ? d.files.folder_bytes : d.files.member_bytes);
        CHECK(share <= 0.55);
        if (replicas == 1 && shuffled)
          MESSAGE("rank " << rank << ", " << (format == 0 ? "PNG folder" : "tar shards") << ": decoded " << rep.samples
                          << " of " << n << " samples, read " << 100 * share << "% of the sample bytes; index (tar headers) "
                          << rep.index_bytes << " bytes; all bytes read / archive bytes "
                          << (format == 0 ? share
                                          : static_cast<double>(rep.bytes_read + rep.index_bytes) / static_cast<double>(d.files.tar_bytes)));
      }
}

TEST_CASE("mpi data: with shards of 28 KiB images, a worker reads at most 55% of all the bytes, headers included"
          * doctest::timeout(300)) {
  const shared_dir dir;
  const std::size_t n = 600, side = 96;
  std::vector<std::string> shards;
  std::uint64_t total = 0;
  for (int s = 0; s < 3; ++s) shards.push_back(dir.path + "/big-" + std::to_string(s) + ".tar");
  if (rank_of() == 0) {
    std::vector<std::uint8_t> px(side * side * 3);
    std::vector<std::unique_ptr<ld::tar_writer>> w;
    for (const auto& s : shards) w.push_back(std::make_unique<ld::tar_writer>(s));
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t k = 0; k < px.size(); ++k) {  // noise: the PNG is about as large as the pixels
        std::uint64_t z = (i << 20) + k + 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        px[k] = static_cast<std::uint8_t>(z >> 56);
      }
      const auto png = ld::encode_png(px.data(), side, side, 3, 1);
      w[i * 3 / n]->add(fashion_test::key(i) + ".png", png.data(), png.size());
      w[i * 3 / n]->add(fashion_test::key(i) + ".cls", std::to_string(i % 7));
    }
    for (auto& x : w) x->close();
    for (const auto& s : shards) total += std::filesystem::file_size(s);
  }
  MPI_Bcast(&total, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const auto src = ld::tar_shards(shards, {.load = {.threads = 1}});
  const std::size_t rank = static_cast<std::size_t>(rank_of()), workers = static_cast<std::size_t>(world_of());
  const auto pipe = src | ld::shuffle(n, 5) | ld::random_resized_crop(32, 32, 6) | ld::batched(32) | ld::prefetch(2);
  for (auto&& b : pipe.epoch(0)) (void)ld::detail::make_sharded(std::move(b), workers, rank, 1);
  const auto rep = src.report();
  const double share = static_cast<double>(rep.bytes_read + rep.index_bytes) / static_cast<double>(total);
  MESSAGE("rank " << rank << ": read " << rep.bytes_read + rep.index_bytes << " of " << total << " bytes (" << 100 * share
                  << "%), of which " << rep.index_bytes << " headers");
  CHECK(share <= 0.55);
  CHECK(sum_over_ranks(rep.samples) == n);
}
