// The image stages: a sample's crop and flip are keyed by (seed, epoch, index) and come out the
// same bits for any plan, load-thread count or worker split; each stage against a reference.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/data.hpp>

namespace ld = lockstep::data;

namespace {

constexpr std::uint32_t C = 3, H = 12, W = 10;

// n images of C x H x W (channels-first) with pseudo-random pixels.
std::shared_ptr<const ld::table> images(std::size_t n) {
  auto t = std::make_shared<ld::table>();
  t->rows = n;
  t->width = C * H * W;
  t->bytes.resize(n * t->width);
  for (std::size_t i = 0; i < t->bytes.size(); ++i) t->bytes[i] = static_cast<std::uint8_t>((i * 40503u + 7) >> 5);
  for (std::size_t i = 0; i < n; ++i) t->labels.push_back(static_cast<std::int32_t>(i % 4));
  return t;
}

std::uint8_t px(const ld::table& t, std::size_t i, std::uint32_t c, std::int64_t y, std::int64_t x) {
  if (y < 0 || x < 0 || y >= H || x >= W) return 0;
  return t.bytes[i * t.width + c * H * W + static_cast<std::size_t>(y) * W + static_cast<std::size_t>(x)];
}

// Every sample's row (features as float) of one epoch, cut with the given plan, keyed by index.
std::map<std::uint64_t, std::vector<float>> rows_of(const ld::dataset<ld::index_batch>& d, std::uint64_t epoch,
                                                   std::size_t parts) {
  std::map<std::uint64_t, std::vector<float>> out;
  for (auto&& b : d.epoch(epoch))
    for (std::size_t first = 0; first < parts; ++first) {
      const auto db = ld::detail::make_sharded(b, parts, first, 1);
      const ld::shard& s = db.shards[0];
      for (std::size_t r = 0; r < s.size; ++r)
        out[s.indices[r]].assign(s.features + r * s.width, s.features + (r + 1) * s.width);
    }
  return out;
}

}  // namespace

TEST_CASE("augment: crops and flips are the same bits for any plan and load threads, new ones each epoch") {
  const auto t = images(61);
  const auto pipeline = [&](std::size_t threads) {
    return ld::indexed(t, C, H, W, {.threads = threads}) | ld::map(ld::scale(1.0f / 255)) |
           ld::random_resized_crop(7, 9, 11) | ld::random_flip(12) | ld::random_crop(7, 9, 2, 13) |
           ld::normalize({0.5f, 0.4f, 0.3f}, {0.2f, 0.25f, 0.3f}) | ld::shuffle(61, 3) | ld::batched(8);
  };
  const auto ref = rows_of(pipeline(1), 5, 1);
  REQUIRE(ref.size() == 61);
  for (const auto& [i, row] : ref) CHECK(row.size() == std::size_t{C} * 7 * 9);
  for (std::size_t threads : {1u, 3u})
    for (std::size_t parts = 1; parts <= 4; ++parts) {
      CAPTURE(threads);
      CAPTURE(parts);
      CHECK(rows_of(pipeline(threads), 5, parts) == ref);
    }
  // Another epoch, other draws (almost every sample changes).
  const auto other = rows_of(pipeline(2), 6, 2);
  std::size_t changed = 0;
  for (const auto& [i, row] : ref) changed += other.at(i) != row;
  CHECK(changed > 50);
  // The order of the stages relative to shuffle does not matter: they key on the sample's index.
  const auto late = ld::indexed(t, C, H, W) | ld::map(ld::scale(1.0f / 255)) | ld::shuffle(61, 3) |
                    ld::random_resized_crop(7, 9, 11) | ld::random_flip(12) | ld::random_crop(7, 9, 2, 13) |
                    ld::normalize({0.5f, 0.4f, 0.3f}, {0.2f, 0.25f, 0.3f}) | ld::batched(5);
  CHECK(rows_of(late, 5, 3) == ref);
  // Workers: each worker's part, cut for its replicas, holds the same rows.
  for (std::size_t world = 2; world <= 3; ++world)
    for (std::size_t rank = 0; rank < world; ++rank) {
      const auto part = pipeline(2) | ld::shard_by_worker(rank, world) | ld::shard_batches(2);
      for (auto&& db : part.epoch(5))
        for (const auto& s : db.shards)
          for (std::size_t r = 0; r < s.size; ++r)
            CHECK(std::vector<float>(s.features + r * s.width, s.features + (r + 1) * s.width) == ref.at(s.indices[r]));
    }
}

TEST_CASE("augment: before or behind cache() the random stages draw in each epoch what they draw without it") {
  // cache() keeps the references, not decoded rows: each epoch decodes and draws again, the same
  // draws as the pipeline without cache() whichever epoch filled it (a resumed run fills it in a
  // later epoch), and reads the source only once.
  const auto t = images(61);
  const auto stages = ld::random_flip(12) | ld::random_crop(7, 9, 2, 13);
  const auto uncached = ld::indexed(t, C, H, W) | stages | ld::batched(8);
  std::vector<std::map<std::uint64_t, std::vector<float>>> want;
  for (std::uint64_t e = 0; e < 4; ++e) want.push_back(rows_of(uncached, e, 1));
  REQUIRE(want[0].size() == 61);
  const auto changed = [](const auto& a, const auto& b) {
    std::size_t n = 0;
    for (const auto& [i, row] : a) n += b.at(i) != row;
    return n;
  };
  CHECK(changed(want[0], want[1]) > 50);  // the epochs draw differently
  CHECK(changed(want[1], want[2]) > 50);
  auto pulled = std::make_shared<std::atomic<std::size_t>>(0);
  const auto count = ld::map([pulled](ld::sample_ref s) {
    ++*pulled;
    return s;
  });
  const auto source = [&] { return ld::indexed(t, C, H, W) | count; };
  for (const std::uint64_t first : {0u, 3u})  // the epoch that fills the cache
    for (int placement = 0; placement < 4; ++placement) {
      CAPTURE(first);
      CAPTURE(placement);  // stages, cache, batched | cache, stages, batched | cache after batched | after prefetch
      const ld::dataset<ld::index_batch> d =
          placement == 0   ? source() | stages | ld::cache() | ld::batched(8)
          : placement == 1 ? source() | ld::cache() | stages | ld::batched(8)
          : placement == 2 ? source() | stages | ld::batched(8) | ld::cache()
                           : source() | stages | ld::batched(8) | ld::prefetch(3) | ld::cache();
      *pulled = 0;
      CHECK(rows_of(d, first, 2) == want[first]);  // the pass that fills the cache
      CHECK(pulled->load() == 61);
      for (const std::uint64_t e : {0u, 1u, 2u, 3u})
        for (const std::size_t parts : {1u, 3u}) {
          CAPTURE(e);
          CAPTURE(parts);
          CHECK(rows_of(d, e, parts) == want[e]);  // replayed: the draws of the uncached pipeline, any plan
        }
      CHECK(pulled->load() == 61);  // replays read nothing upstream
      // Each worker's part of a cached epoch, cut for its replicas, holds the same rows.
      if (placement == 2)
        for (std::size_t rank = 0; rank < 2; ++rank)
          for (auto&& db : (d | ld::shard_by_worker(rank, 2) | ld::shard_batches(2)).epoch(1))
            for (const auto& sh : db.shards)
              for (std::size_t r = 0; r < sh.size; ++r)
                CHECK(std::vector<float>(sh.features + r * sh.width, sh.features + (r + 1) * sh.width) ==
                      want[1].at(sh.indices[r]));
    }
  // Behind a repeat, the repetitions of an epoch and the epochs draw anew too.
  const auto repeated = ld::indexed(t, C, H, W) | ld::repeat(2) | ld::cache() | stages | ld::batched(8);
  const auto r0 = rows_of(repeated, 0, 1), r1 = rows_of(repeated, 1, 2);
  REQUIRE(r1.size() == 61);
  CHECK(changed(r0, r1) > 50);
  CHECK(rows_of(repeated, 1, 3) == r1);
}

TEST_CASE("augment: random_flip mirrors exactly, with its probability") {
  const auto t = images(400);
  const auto plain = rows_of(ld::indexed(t, C, H, W) | ld::batched(64), 0, 1);
  const auto all = rows_of(ld::indexed(t, C, H, W) | ld::random_flip(4, 1.0) | ld::batched(64), 0, 2);
  const auto none = rows_of(ld::indexed(t, C, H, W) | ld::random_flip(4, 0.0) | ld::batched(64), 0, 2);
  const auto half = rows_of(ld::indexed(t, C, H, W) | ld::random_flip(4) | ld::batched(64), 0, 3);
  CHECK(none == plain);
  std::size_t flipped = 0;
  for (const auto& [i, row] : plain) {
    std::vector<float> mirror(row.size());
    for (std::uint32_t c = 0; c < C; ++c)
      for (std::uint32_t y = 0; y < H; ++y)
        for (std::uint32_t x = 0; x < W; ++x)
          mirror[(c * H + y) * W + x] = row[(c * H + y) * W + (W - 1 - x)];
    CHECK(all.at(i) == mirror);
    CHECK((half.at(i) == mirror || half.at(i) == row));
    flipped += half.at(i) == mirror;
  }
  CHECK(flipped > 150);
  CHECK(flipped < 250);
}

TEST_CASE("augment: random_crop with padding takes a window of the zero-padded image, every position") {
  const auto t = images(1500);
  const std::uint32_t h = 9, w = 8, pad = 3;
  const auto got = rows_of(ld::indexed(t, C, H, W) | ld::random_crop(h, w, pad, 21) | ld::batched(50), 1, 2);
  std::set<std::pair<int, int>> positions;
  for (const auto& [i, row] : got) {
    int found = 0;
    for (int top = -static_cast<int>(pad); top <= static_cast<int>(H + pad - h); ++top)
      for (int left = -static_cast<int>(pad); left <= static_cast<int>(W + pad - w); ++left) {
        bool same = true;
        for (std::uint32_t c = 0; c < C && same; ++c)
          for (std::uint32_t y = 0; y < h && same; ++y)
            for (std::uint32_t x = 0; x < w && same; ++x)
              same = row[(c * h + y) * w + x] == static_cast<float>(px(*t, i, c, top + y, left + x));
        if (same) {
          ++found;
          positions.insert({top, left});
        }
      }
    CHECK(found >= 1);
  }
  CHECK(positions.size() == (H + 2 * pad - h + 1) * (W + 2 * pad - w + 1));  // all 10 x 9 reached in 1500 draws
  CHECK_THROWS_AS((void)rows_of(ld::indexed(t, C, H, W) | ld::random_crop(20, 8, 3, 1) | ld::batched(8), 0, 1),
                  lockstep::shape_error);
}

TEST_CASE("augment: resize is bilinear with half-pixel centres, centre_crop pads, resized crop of the whole image is a resize") {
  const auto t = images(5);
  for (const auto& size : {std::pair{12u, 10u}, std::pair{24u, 20u}, std::pair{5u, 7u}, std::pair{1u, 1u}, std::pair{31u, 3u}}) {
    const std::uint32_t oh = size.first, ow = size.second;  // not structured bindings: lambdas use them
    CAPTURE(oh);
    CAPTURE(ow);
    const auto got = rows_of(ld::indexed(t, C, H, W) | ld::resize(oh, ow) | ld::batched(2), 0, 1);
    for (const auto& sample : got) {
      const std::uint64_t i = sample.first;
      const std::vector<float>& row = sample.second;
      for (std::uint32_t c = 0; c < C; ++c)
        for (std::uint32_t y = 0; y < oh; ++y)
          for (std::uint32_t x = 0; x < ow; ++x) {
            const double sy = std::clamp((y + 0.5) * H / oh - 0.5, 0.0, H - 1.0);
            const double sx = std::clamp((x + 0.5) * W / ow - 0.5, 0.0, W - 1.0);
            const auto y0 = static_cast<std::int64_t>(std::floor(sy)), x0 = static_cast<std::int64_t>(std::floor(sx));
            const double fy = sy - y0, fx = sx - x0;
            const auto p = [&](std::int64_t yy, std::int64_t xx) {
              return static_cast<double>(px(*t, i, c, std::min<std::int64_t>(yy, H - 1), std::min<std::int64_t>(xx, W - 1)));
            };
            const double want = (p(y0, x0) * (1 - fx) + p(y0, x0 + 1) * fx) * (1 - fy) +
                                (p(y0 + 1, x0) * (1 - fx) + p(y0 + 1, x0 + 1) * fx) * fy;
            CHECK(std::fabs(row[(c * oh + y) * ow + x] - want) <= 1.0);
          }
    }
  }
  const auto same = rows_of(ld::indexed(t, C, H, W) | ld::resize(H, W) | ld::batched(2), 0, 1);
  const auto plain = rows_of(ld::indexed(t, C, H, W) | ld::batched(2), 0, 1);
  CHECK(same == plain);  // exact at scale 1
  const auto whole = rows_of(ld::indexed(t, C, H, W) |
                                 ld::random_resized_crop(6, 5, 3, {.min_scale = 1, .max_scale = 1, .min_ratio = 10.0 / 12, .max_ratio = 10.0 / 12}) |
                                 ld::batched(2),
                             0, 1);
  CHECK(whole == rows_of(ld::indexed(t, C, H, W) | ld::resize(6, 5) | ld::batched(2), 0, 1));
  const auto centre = rows_of(ld::indexed(t, C, H, W) | ld::center_crop(14, 6) | ld::batched(2), 0, 1);
  for (const auto& [i, row] : centre)
    for (std::uint32_t y = 0; y < 14; ++y)
      for (std::uint32_t x = 0; x < 6; ++x) CHECK(row[y * 6 + x] == static_cast<float>(px(*t, i, 0, int(y) - 1, int(x) + 2)));
}

TEST_CASE("augment: random_resized_crop draws areas and ratios in range") {
  const auto t = images(200);
  std::size_t distinct = 0;
  const auto got = rows_of(ld::indexed(t, C, H, W) | ld::random_resized_crop(4, 4, 99) | ld::batched(40), 2, 2);
  const auto plain = rows_of(ld::indexed(t, C, H, W) | ld::resize(4, 4) | ld::batched(40), 2, 2);
  for (const auto& [i, row] : got) {
    CHECK(row.size() == C * 16);
    distinct += row != plain.at(i);
  }
  CHECK(distinct > 150);
}

TEST_CASE("augment: normalize is (v * scale - mean) * (1 / std) per channel, at staging") {
  const auto t = images(9);
  const std::vector<float> mean{0.1f, 0.2f, 0.3f}, sd{0.5f, 0.25f, 2.0f};
  const auto got = rows_of(ld::indexed(t, C, H, W) | ld::map(ld::scale(1.0f / 255)) | ld::normalize(mean, sd) | ld::batched(4), 0, 2);
  for (const auto& [i, row] : got)
    for (std::uint32_t c = 0; c < C; ++c)
      for (std::uint32_t k = 0; k < H * W; ++k) {
        const float v = static_cast<float>(t->bytes[i * t->width + c * H * W + k]) * (1.0f / 255);
        CHECK(row[c * H * W + k] == (v - mean[c]) * (1.0f / sd[c]));
      }
  const auto one = rows_of(ld::indexed(t, C, H, W) | ld::normalize({2.0f}, {4.0f}) | ld::batched(4), 0, 1);
  for (const auto& [i, row] : one) CHECK(row[5] == (static_cast<float>(t->bytes[i * t->width + 5]) - 2.0f) * 0.25f);
}

TEST_CASE("augment: bad options are refused when the stage is made or applied") {
  CHECK_THROWS_AS(ld::random_crop(0, 4, 1, 1), lockstep::config_error);
  CHECK_THROWS_AS(ld::resize(4, 0), lockstep::config_error);
  CHECK_THROWS_AS(ld::random_flip(1, 1.5), lockstep::config_error);
  CHECK_THROWS_AS(ld::random_resized_crop(4, 4, 1, {.min_scale = 0.5, .max_scale = 0.4}), lockstep::config_error);
  CHECK_THROWS_AS(ld::random_resized_crop(4, 4, 1, {.min_scale = 0}), lockstep::config_error);
  CHECK_THROWS_AS(ld::normalize({1, 2}, {1}), lockstep::config_error);
  const auto t = images(3);
  const auto two = ld::indexed(t, C, H, W) | ld::normalize({1, 2}, {1, 1}) | ld::batched(2);
  CHECK_THROWS_AS((void)rows_of(two, 0, 1), lockstep::config_error);  // 2 values for 3 channels
  const auto zero = ld::indexed(t, C, H, W) | ld::normalize({0}, {0}) | ld::batched(2);
  CHECK_THROWS_AS((void)rows_of(zero, 0, 1), lockstep::config_error);
  // A subnormal standard deviation is > 0, and its reciprocal is infinite (1e-39) or near the
  // float's limit (1e-38: values away from the mean would be +-inf).
  for (const auto& [sd, shown] : {std::pair{1e-39f, "1.00000022e-39"}, std::pair{1e-38f, "9.99999935e-39"}}) {
    const auto tiny = ld::indexed(t, C, H, W) | ld::normalize({0}, {sd}) | ld::batched(2);
    CHECK_THROWS_WITH_AS((void)rows_of(tiny, 0, 1),
                         doctest::Contains(("of at least 1.17549435e-38 (the smallest normal float), got " + std::string(shown)).c_str()),
                         lockstep::config_error);
  }
  const auto least = ld::indexed(t, C, H, W) | ld::normalize({0}, {std::numeric_limits<float>::min()}) | ld::batched(2);
  CHECK_NOTHROW((void)rows_of(least, 0, 1));
  auto f = std::make_shared<ld::table>();
  f->rows = 2;
  f->width = 2;
  f->values = {1, 2, 3, 4};
  const auto floats = ld::indexed(f) | ld::random_flip(1) | ld::batched(2);
  CHECK_THROWS_AS((void)rows_of(floats, 0, 1), lockstep::config_error);  // image stages need images
}
