// Index first, decode after the shard: index batches cut for any plan give the bits of the
// ordinary pipeline over the same table; each cut loads exactly the rows of its shards; a resume
// that skips batches loads none of them; decoding ahead behind prefetch changes nothing; errors
// name the sample; the decoded-row buffers come from the pool's memory resource and stop growing.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/data.hpp>

namespace ld = lockstep::data;

namespace {

// A table of n rows of `width` uint8 pixels (a pseudo-random pattern) with labels i % 10.
std::shared_ptr<const ld::table> pixel_table(std::size_t n, std::size_t width) {
  auto t = std::make_shared<ld::table>();
  t->rows = n;
  t->width = width;
  t->bytes.resize(n * width);
  for (std::size_t i = 0; i < t->bytes.size(); ++i) t->bytes[i] = static_cast<std::uint8_t>((i * 2654435761u) >> 13);
  for (std::size_t i = 0; i < n; ++i) t->labels.push_back(static_cast<std::int32_t>(i % 10));
  return t;
}

// A source over a table that records which samples it loads and can fail at one of them.
class recording_source final : public ld::sample_source {
public:
  recording_source(std::shared_ptr<const ld::table> t, std::size_t group_size = 0, std::int64_t fail_at = -1)
      : inner_(std::make_shared<ld::table_source>(t)), group_size_(group_size), fail_at_(fail_at) {}
  std::uint64_t size() const override { return inner_->size(); }
  bool labels_in_index() const override { return inner_->labels_in_index(); }
  std::int32_t label(std::uint64_t i) const override { return inner_->label(i); }
  std::uint32_t group(std::uint64_t i) const override {
    return group_size_ ? static_cast<std::uint32_t>(i / group_size_) : 0;
  }
  std::uint32_t channels() const override { return 1; }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> fixed_size() const override { return inner_->fixed_size(); }
  void load(std::uint64_t i, const ld::region_planner& r, ld::decoded_sample& out, ld::load_scratch& s) const override {
    {
      std::lock_guard lock(mutex_);
      loaded_.push_back(i);
    }
    if (static_cast<std::int64_t>(i) == fail_at_) throw lockstep::data_error("recording_source: sample " + std::to_string(i) + " is bad");
    inner_->load(i, r, out, s);
  }
  std::string name_of(std::uint64_t i) const override { return "row " + std::to_string(i); }
  std::string describe() const override { return "recording"; }
  std::vector<std::uint64_t> take_loaded() const {
    std::lock_guard lock(mutex_);
    auto out = std::move(loaded_);
    loaded_.clear();
    return out;
  }

private:
  std::shared_ptr<ld::table_source> inner_;
  std::size_t group_size_;
  std::int64_t fail_at_;
  mutable std::mutex mutex_;
  mutable std::vector<std::uint64_t> loaded_;
};

// True when the shards carry the same bits.
bool same_shard(const ld::shard& a, const ld::shard& b) {
  if (a.size != b.size || a.offset != b.offset || a.global_size != b.global_size || a.width != b.width) return false;
  if (a.size == 0) return true;
  if (std::memcmp(a.features, b.features, a.size * a.width * sizeof(float)) != 0) return false;
  if ((a.labels == nullptr) != (b.labels == nullptr)) return false;
  if (a.labels && std::memcmp(a.labels, b.labels, a.size * sizeof(std::int32_t)) != 0) return false;
  return std::memcmp(a.indices, b.indices, a.size * sizeof(std::uint64_t)) == 0;
}

}  // namespace

TEST_CASE("index-first: every plan of every batch gives the bits of the ordinary pipeline") {
  for (std::size_t n : {0u, 1u, 7u, 97u, 259u})
    for (std::size_t bs : {1u, 5u, 32u})
      for (bool shuffled : {false, true})
        for (std::size_t threads : {1u, 3u}) {
          CAPTURE(n);
          CAPTURE(bs);
          CAPTURE(shuffled);
          CAPTURE(threads);
          const auto t = pixel_table(n, 12);
          const std::size_t buffer = shuffled ? n + 1 : 1;
          const auto ref = ld::from_table(t) | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(buffer, 9) | ld::batched(bs);
          const auto idx = ld::indexed(t, 1, 3, 4, {.threads = threads}) | ld::map(ld::scale(1.0f / 255)) |
                           ld::shuffle(buffer, 9) | ld::batched(bs);
          std::vector<ld::pooled_batch> want;
          for (auto&& b : ref.epoch(2)) want.push_back(b);
          std::size_t k = 0;
          for (auto&& b : idx.epoch(2)) {
            REQUIRE(k < want.size());
            CHECK(b.indices == want[k].indices);
            CHECK(b.features.empty());  // nothing loaded before the cut
            for (std::size_t parts = 1; parts <= 5; ++parts)
              for (std::size_t first = 0; first < parts; ++first)
                for (std::size_t count = 1; first + count <= parts; count += 2) {
                  const auto got = ld::detail::make_sharded(b, parts, first, count);
                  const auto exp = ld::detail::make_sharded(want[k], parts, first, count);
                  REQUIRE(got.shards.size() == count);
                  for (std::size_t r = 0; r < count; ++r) CHECK(same_shard(got.shards[r], exp.shards[r]));
                  CHECK(got.global_size() == b.rows());
                  CHECK(got.global->first_held == exp.shards.front().offset);
                }
            ++k;
          }
          CHECK(k == want.size());
        }
}

TEST_CASE("index-first: shard_batches, shard_by_worker and float rows as the ordinary pipeline") {
  for (std::size_t n : {0u, 13u, 100u}) {
    CAPTURE(n);
    const auto t = pixel_table(n, 6);
    for (std::size_t world = 1; world <= 3; ++world)
      for (std::size_t rank = 0; rank < world; ++rank) {
        const auto ref = ld::from_table(t) | ld::shuffle(50, 4) | ld::batched(8) | ld::shard_by_worker(rank, world) |
                         ld::shard_batches(2);
        const auto idx = ld::indexed(t) | ld::shuffle(50, 4) | ld::batched(8) | ld::shard_by_worker(rank, world) |
                         ld::shard_batches(2) | ld::prefetch(2);
        std::vector<ld::distributed_batch> want;
        for (auto&& d : ref.epoch(0)) want.push_back(d);
        std::size_t k = 0;
        for (auto&& d : idx.epoch(0)) {
          REQUIRE(k < want.size());
          for (std::size_t r = 0; r < 2; ++r) {
            // shard_by_worker gives each worker a batch of its own: offsets are within it.
            CHECK(same_shard(d.shards[r], want[k].shards[r]));
          }
          ++k;
        }
        CHECK(k == want.size());
      }
  }
  // Float rows: copied, scaled at staging, like views of a float table.
  auto f = std::make_shared<ld::table>();
  f->rows = 21;
  f->width = 5;
  for (std::size_t i = 0; i < 105; ++i) f->values.push_back(static_cast<float>(i) * 0.37f - 3.0f);
  const auto ref = ld::from_table(f) | ld::map(ld::scale(0.5f)) | ld::batched(4);
  const auto idx = ld::indexed(f) | ld::map(ld::scale(0.5f)) | ld::batched(4);
  std::vector<ld::pooled_batch> want;
  for (auto&& b : ref.epoch(0)) want.push_back(b);
  std::size_t k = 0;
  for (auto&& b : idx.epoch(0)) {
    const auto got = ld::detail::make_sharded(b, 3, 0, 3);
    const auto exp = ld::detail::make_sharded(want[k++], 3, 0, 3);
    for (std::size_t r = 0; r < 3; ++r) CHECK(same_shard(got.shards[r], exp.shards[r]));
  }
  CHECK(k == want.size());
}

TEST_CASE("index-first: a cut loads exactly the rows of the shards it keeps, each once per epoch") {
  const std::size_t n = 103, bs = 16;
  const auto t = pixel_table(n, 8);
  for (std::size_t workers = 1; workers <= 3; ++workers)
    for (std::size_t replicas = 1; replicas <= 3; ++replicas) {
      CAPTURE(workers);
      CAPTURE(replicas);
      std::vector<int> seen(n, 0);
      for (std::size_t rank = 0; rank < workers; ++rank) {
        auto src = std::make_shared<recording_source>(t);
        const auto d = ld::indexed(src, {.threads = 2}) | ld::shuffle(n, 3) | ld::batched(bs) | ld::prefetch(2);
        std::size_t expected = 0;
        for (auto&& b : d.epoch(1)) {
          const auto db = ld::detail::make_sharded(std::move(b), workers * replicas, rank * replicas, replicas);
          std::set<std::uint64_t> mine;
          for (const auto& s : db.shards)
            for (auto i : s.index_span()) mine.insert(i);
          expected += mine.size();
        }
        auto loaded = src->take_loaded();
        CHECK(loaded.size() == expected);  // nothing but the kept rows, nothing twice
        for (auto i : loaded) ++seen[i];
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));  // every sample by one worker
    }
}

TEST_CASE("index-first: skipping batches without cutting them (a resume) loads none of their rows") {
  const std::size_t n = 300, bs = 10, skip = 17;
  const auto t = pixel_table(n, 4);
  auto src = std::make_shared<recording_source>(t);
  const auto d = ld::indexed(src, {.threads = 2}) | ld::shuffle(n, 8) | ld::batched(bs) | ld::prefetch(3);
  std::set<std::uint64_t> skipped, kept;
  std::size_t k = 0;
  for (auto&& b : d.epoch(4)) {
    if (k++ < skip) {  // what fit does for the batches a checkpoint says were consumed
      skipped.insert(b.indices.begin(), b.indices.end());
      continue;
    }
    const auto db = ld::detail::make_sharded(std::move(b), 2, 0, 2);
    for (const auto& s : db.shards) kept.insert(s.indices, s.indices + s.size);
  }
  const auto loaded = src->take_loaded();
  CHECK(loaded.size() == kept.size());
  for (auto i : loaded) CHECK(skipped.count(i) == 0);
  CHECK(skipped.size() == skip * bs);
}

TEST_CASE("index-first: load_options::threads beyond max_load_threads is refused when the source is made, naming it") {
  const auto t = pixel_table(10, 16);
  for (const std::size_t threads : {ld::max_load_threads + 1, std::size_t{1} << 20, SIZE_MAX})
    CHECK_THROWS_WITH_AS((void)ld::indexed(t, 1, 4, 4, {.threads = threads}),
                         doctest::Contains(("load_options::threads is " + std::to_string(threads)).c_str()), lockstep::config_error);
}

TEST_CASE("index-first: behind prefetch, batches are decoded ahead once the plan is known") {
  const auto t = pixel_table(500, 16);
  const auto src = ld::indexed(t, 1, 4, 4, {.threads = 2});
  const auto d = src | ld::shuffle(500, 1) | ld::batched(20) | ld::prefetch(2);
  const auto ref = ld::from_table(t) | ld::shuffle(500, 1) | ld::batched(20);
  for (std::uint64_t e = 0; e < 2; ++e) {
    std::vector<ld::pooled_batch> want;
    for (auto&& b : ref.epoch(e)) want.push_back(b);
    std::size_t k = 0;
    for (auto&& b : d.epoch(e)) {
      const auto got = ld::detail::make_sharded(std::move(b), 3, 1, 2);
      const auto exp = ld::detail::make_sharded(want[k++], 3, 1, 2);
      for (std::size_t r = 0; r < 2; ++r) CHECK(same_shard(got.shards[r], exp.shards[r]));
    }
  }
  const auto rep = src.report();
  CHECK(rep.cut_batches == 50);
  CHECK(rep.ahead_batches > 0);
  CHECK(rep.ahead_batches + rep.cut_decoded == rep.cut_batches);
  CHECK(rep.samples == rep.staged_rows);  // each kept row loaded once
  CHECK(rep.text().find("pipeline report") != std::string::npos);
}

TEST_CASE("index-first: shard_by_worker after prefetch loads this worker's rows only, and before it loads them ahead") {
  const auto t = pixel_table(500, 16);
  for (const bool prefetch_first : {true, false}) {
    CAPTURE(prefetch_first);
    const auto src = ld::indexed(t, 1, 4, 4, {.threads = 2});
    const auto batches = src | ld::shuffle(500, 1) | ld::batched(20);
    const auto d = prefetch_first ? batches | ld::prefetch(2) | ld::shard_by_worker(1, 2)
                                  : batches | ld::shard_by_worker(1, 2) | ld::prefetch(2);
    const auto ref = ld::from_table(t) | ld::shuffle(500, 1) | ld::batched(20) | ld::shard_by_worker(1, 2);
    std::vector<ld::pooled_batch> want;
    for (auto&& b : ref.epoch(0)) want.push_back(b);
    std::size_t k = 0;
    for (auto&& b : d.epoch(0)) {
      const auto got = ld::detail::make_sharded(std::move(b), 2, 0, 2);
      const auto exp = ld::detail::make_sharded(want[k++], 2, 0, 2);
      for (std::size_t r = 0; r < 2; ++r) CHECK(same_shard(got.shards[r], exp.shards[r]));
    }
    CHECK(k == 25);
    const auto rep = src.report();
    CHECK(rep.cut_batches == 25);
    CHECK(rep.samples == 250);  // this worker's half, each row once: nothing of the other worker's
    CHECK(rep.samples == rep.staged_rows);
    if (prefetch_first)
      CHECK(rep.ahead_batches == 0);  // the whole batches are not decoded ahead: their slices are cut
    else
      CHECK(rep.ahead_batches > 0);
  }
}

TEST_CASE("index-first: a failing sample is reported at its cut, the lowest failing row's error") {
  const auto t = pixel_table(64, 4);
  auto src = std::make_shared<recording_source>(t, 0, 37);
  const auto d = ld::indexed(src, {.threads = 3}) | ld::batched(16) | ld::prefetch(2);
  std::size_t cut = 0;
  try {
    for (auto&& b : d.epoch(0)) {
      (void)ld::detail::make_sharded(std::move(b), 4, 0, 4);
      ++cut;
    }
    FAIL("no error");
  } catch (const lockstep::data_error& e) {
    CHECK(std::string(e.what()).find("sample 37") != std::string::npos);
  }
  CHECK(cut == 2);  // batches 0 and 1 were trained on; batch 2 holds sample 37
  // Plans and widths that cannot work are refused.
  const auto idx = ld::indexed(pixel_table(8, 4)) | ld::batched(4);
  for (auto&& b : idx.epoch(0)) {
    CHECK_THROWS_AS((void)ld::detail::make_sharded(b, 2, 1, 2), lockstep::config_error);
    CHECK_THROWS_AS((void)ld::detail::make_sharded(b, 0, 0, 1), lockstep::config_error);
    const auto db = ld::detail::make_sharded(b, 2, 1, 1);
    CHECK_THROWS_AS((void)ld::whole(*db.global), lockstep::config_error);  // holds rows 2..4 only
    CHECK_THROWS_AS((void)ld::split(*db.global, 2), lockstep::config_error);
    const auto all = ld::detail::make_sharded(b, 2, 0, 2);  // one process keeping every shard
    CHECK(all.global->holds_every_row());
    CHECK(ld::whole(*all.global).size == 4);  // what a step that reads the whole batch uses
  }
  CHECK_THROWS_AS(ld::table_source(pixel_table(3, 12), 1, 3, 5), lockstep::config_error);
  // A table with regression targets: index-first batches would drop them; refused, naming from_table.
  auto regression = std::make_shared<ld::table>();
  regression->rows = 4;
  regression->width = 2;
  regression->values.assign(8, 0.5f);
  regression->target_width = 1;
  regression->targets.assign(4, 2.0f);
  CHECK_THROWS_WITH_AS((void)ld::indexed(regression), doctest::Contains("regression targets (1 per row)"),
                       lockstep::config_error);
  CHECK_THROWS_WITH_AS((void)ld::indexed(regression), doctest::Contains("data::from_table"), lockstep::config_error);
  const auto kept = ld::from_table(regression) | ld::batched(4);
  for (auto&& b : kept.epoch(0)) CHECK(b.targets.size() == 4);
}

namespace {

// A user image source of 4x4 grey images: sample 0 well formed, sample 1 without its pixels,
// sample 2 with a region past the image's right edge, sample 3 with a row too many, sample 4 with
// the top half only (a region inside the image, where no stage crops).
class careless_source final : public ld::sample_source {
public:
  std::uint64_t size() const override { return 5; }
  std::uint32_t channels() const override { return 1; }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> fixed_size() const override { return std::pair{4u, 4u}; }
  void load(std::uint64_t i, const ld::region_planner& regions, ld::decoded_sample& out, ld::load_scratch&) const override {
    out.channels = 1;
    out.height = out.width = 4;
    out.region = regions.plan(4, 4);
    if (i == 2) out.region = {2, 0, 4, 4};
    if (i == 4) out.region = {0, 0, 4, 2};
    if (i != 1) out.pixels.assign(std::size_t{out.region.width} * out.region.height + (i == 3 ? 4 : 0), 7);
  }
  std::string name_of(std::uint64_t i) const override { return "careless " + std::to_string(i); }
  std::string describe() const override { return "careless"; }
};

}  // namespace

TEST_CASE("index-first: a user source's pixels that do not match its region, or a region outside the image, are refused") {
  const auto d = ld::indexed(std::make_shared<careless_source>()) | ld::batched(1);
  std::vector<std::string> errors;
  for (auto&& b : d.epoch(0)) {
    try {
      const auto db = ld::detail::make_sharded(std::move(b), 1, 0, 1);
      CHECK(db.shards[0].features[0] == 7.0f);
      errors.emplace_back();
    } catch (const lockstep::data_error& e) {
      errors.emplace_back(e.what());
    }
  }
  REQUIRE(errors.size() == 5);
  CHECK(errors[0].empty());
  CHECK(errors[1].find("careless 1: the source produced 0 bytes of pixels for the region of 4x4 at (0, 0) of a 4x4 image") !=
        std::string::npos);
  CHECK(errors[2].find("careless 2: the source produced 16 bytes of pixels for the region of 4x4 at (2, 0)") !=
        std::string::npos);
  CHECK(errors[3].find("careless 3: the source produced 20 bytes") != std::string::npos);
  CHECK(errors[4].find("careless 4: the source produced the region of 4x2 at (0, 0), and the image stages read the whole 4x4 image") !=
        std::string::npos);
}

namespace {

// A memory resource that counts what it hands out (as a pinned-memory resource would).
class counting_resource final : public std::pmr::memory_resource {
public:
  std::atomic<std::size_t> allocated{0}, live{0};

private:
  void* do_allocate(std::size_t bytes, std::size_t align) override {
    allocated += bytes;
    live += bytes;
    return std::pmr::new_delete_resource()->allocate(bytes, align);
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t align) override {
    live -= bytes;
    std::pmr::new_delete_resource()->deallocate(p, bytes, align);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }
};

}  // namespace

TEST_CASE("index-first: decoded rows come from the pool's memory resource, bounded by the prefetch depth") {
  counting_resource pinned;
  {
    const auto t = pixel_table(2000, 64);
    const std::size_t depth = 2, batch_bytes = 100 * 64;
    const auto src = ld::indexed(t, 1, 8, 8, {.threads = 2, .memory = &pinned});
    const auto d = src | ld::shuffle(2000, 5) | ld::batched(100) | ld::prefetch(depth);
    for (std::uint64_t e = 0; e < 6; ++e)
      for (auto&& b : d.epoch(e)) (void)ld::detail::make_sharded(std::move(b), 2, 0, 2);
    // In flight at most: the queue, the batch the producer decodes, the one the consumer stages.
    CHECK(pinned.allocated.load() > 0);
    CHECK(pinned.allocated.load() <= (depth + 2) * batch_bytes);
    const auto rep = src.report();
    CHECK(rep.decoded_batch_bytes == batch_bytes);
    CHECK(rep.peak_row_buffer_bytes == pinned.allocated.load());
  }
  CHECK(pinned.live.load() == 0);  // every buffer went back
}

TEST_CASE("batch_pool: row buffers are reused, aligned and returned") {
  auto pool = std::make_shared<ld::batch_pool>(2);
  std::byte* first = nullptr;
  {
    auto a = pool->acquire_rows(1000);
    first = a.data();
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % ld::batch_pool::alignment == 0);
    CHECK(a.capacity() >= 1000);
  }
  auto b = pool->acquire_rows(500);  // the idle 1000-byte block fits
  CHECK(b.data() == first);
  auto c = pool->acquire_rows(4000);
  CHECK(c.data() != first);
  CHECK(pool->row_bytes() == 5000);
  b.reset();
  c.reset();
  CHECK(pool->peak_row_bytes() == 5000);
}

TEST_CASE("batch_pool: keeps as many idle batches and row buffers as were ever out at once, so a deep prefetch allocates nothing after its first epoch") {
  // max_free 2, but 5 out at once (prefetch(3)'s batches in flight): all come back and are reused.
  for (const std::size_t out : {std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{17}}) {
    CAPTURE(out);
    auto pool = std::make_shared<ld::batch_pool>(2);
    std::vector<const float*> first_epoch;  // the feature buffers the first epoch allocated
    for (int epoch = 0; epoch < 3; ++epoch) {
      CAPTURE(epoch);
      std::vector<ld::pooled_batch> batches;
      std::vector<ld::row_buffer> rows;
      for (std::size_t i = 0; i < out; ++i) {
        ld::pooled_batch b(pool->acquire(), pool);
        b.features.resize(64);
        b.indices.resize(4);
        if (epoch == 0)
          first_epoch.push_back(b.features.data());
        else
          CHECK(std::find(first_epoch.begin(), first_epoch.end(), b.features.data()) != first_epoch.end());
        batches.push_back(std::move(b));
        rows.push_back(pool->acquire_rows(256));
      }
      CHECK(pool->row_bytes() == out * 256);  // epochs 2 and 3 allocate no row buffer
      CHECK(pool->idle() == 0);               // every idle batch was reused
      batches.clear();
      rows.clear();
      CHECK(pool->idle() == out);  // all kept, above max_free
    }
  }
}

namespace {

// A user source of grey images whose size the recipe does not fix: samples 0 to 3 are 4x4,
// the others 5x5. The 4x4 samples load slowly (the window in which another thread could learn a
// width from a later batch).
class mixed_size_source final : public ld::sample_source {
public:
  std::uint64_t size() const override { return 16; }
  std::uint32_t channels() const override { return 1; }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> fixed_size() const override { return std::nullopt; }
  void load(std::uint64_t i, const ld::region_planner& regions, ld::decoded_sample& out, ld::load_scratch&) const override {
    if (i < 4) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    const std::uint32_t side = i < 4 ? 4 : 5;
    out.channels = 1;
    out.height = out.width = side;
    out.region = regions.plan(side, side);
    out.pixels.assign(std::size_t{out.region.width} * out.region.height, static_cast<std::uint8_t>(i));
  }
  std::string name_of(std::uint64_t i) const override { return "mixed " + std::to_string(i); }
  std::string describe() const override { return "mixed sizes"; }
};

}  // namespace

TEST_CASE("index-first: a width the recipe does not fix is learned by the first cut, and a sample of another size is an error at its cut") {
  // Batch 0 holds samples 0..3 (4x4), batch 1 samples 4..7 (5x5). For every plan, with and without
  // decoding ahead behind prefetch (which must not learn a width from batch 1 while batch 0's cut
  // loads), the first cut learns 16 from its first row, stages batch 0 at that width and refuses
  // batch 1, naming its first sample this process loads.
  for (const std::size_t depth : {0u, 2u})
    for (const auto& plan : {std::pair<std::size_t, std::size_t>{1, 0}, {2, 0}, {2, 1}, {4, 3}}) {
      const std::size_t parts = plan.first, first = plan.second;  // (lambdas below capture them)
      CAPTURE(depth);
      CAPTURE(parts);
      CAPTURE(first);
      const auto src = std::make_shared<mixed_size_source>();
      std::size_t cut = 0;
      std::string error;
      const auto run = [&](const auto& d) {
        try {
          for (auto&& b : d.epoch(0)) {
            const auto db = ld::detail::make_sharded(std::move(b), parts, first, 1);
            CHECK(db.shards[0].width == 16);
            ++cut;
          }
        } catch (const lockstep::shape_error& e) {
          error = e.what();
        }
      };
      if (depth == 0)
        run(ld::indexed(src, {.threads = 2}) | ld::batched(4));
      else
        run(ld::indexed(src, {.threads = 2}) | ld::batched(4) | ld::prefetch(depth));
      CHECK(cut == 1);
      const std::size_t named = 4 + 4 * first / parts;  // batch 1's first row on this worker
      CHECK_MESSAGE(error.find("mixed " + std::to_string(named)) != std::string::npos, error);
    }
}
