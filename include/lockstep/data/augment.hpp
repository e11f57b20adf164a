#pragma once
/// @file augment.hpp
/// Image stages of index-first pipelines: random crop with padding, random resized crop,
/// horizontal flip, resize, centre crop, and per-channel normalisation. They apply to a dataset of
/// `sample_ref` (before or after shuffle and batched) and run where the sample is decoded, after
/// the cut into shards. A random stage draws from lockstep's counter-based RNG keyed by (its seed,
/// the epoch, the sample's dataset index), so a sample gets the same crop and flip whatever the
/// number of workers, replicas or load threads, and whichever thread decodes it.
///
/// The geometric stages compose one map from output to source pixels; the decoded image is read
/// once, interpolated bilinearly where the map scales (half-pixel centres, borders clamped, no
/// antialiasing when shrinking), and written channels-first as uint8. Pixels outside the image
/// (padding) are 0. Normalisation happens when the rows are converted to float at the cut:
/// (v × scale − mean[c]) × (1 / std[c]), where scale is what `map(scale(k))` recorded.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/data/indexed.hpp>

namespace lockstep::data {

namespace detail {

/// The random draws of one stage for one sample: counter_rng(seed, stream(tag, epoch)) at
/// positions index × 64 + k, so draws never depend on which thread or process decodes the sample.
class sample_draws {
public:
  sample_draws(std::uint64_t seed, std::uint64_t tag, std::uint64_t epoch, std::uint64_t index) noexcept
      : rng_(seed, mix_stream(tag, epoch)), base_(index << 6) {}
  /// A uniform double in [0, 1), draw k (k < 64).
  [[nodiscard]] double uniform(std::uint64_t k) const noexcept { return rng_.uniform_double(base_ + k); }
  /// A uniform integer in [0, n], draw k (k < 64).
  [[nodiscard]] std::uint32_t integer(std::uint64_t k, std::uint32_t n) const noexcept {
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(rng_.u32(base_ + k)) * (std::uint64_t{n} + 1)) >> 32);
  }

private:
  counter_rng rng_;
  std::uint64_t base_;
};

// Stream tags: each kind of random stage draws from its own stream.
inline constexpr std::uint64_t tag_random_crop = 0x72616e64'63726f70ull;
inline constexpr std::uint64_t tag_resized_crop = 0x72657363'726f7021ull;
inline constexpr std::uint64_t tag_flip = 0x666c6970'686f7221ull;

inline std::string size_text(std::uint32_t h, std::uint32_t w) { return std::to_string(h) + "x" + std::to_string(w); }

inline void check_size(const char* who, std::uint32_t h, std::uint32_t w) {
  if (h == 0 || w == 0) throw config_error(std::string("lockstep::data::") + who + ": the output size must be > 0");
}

/// Applies a new recipe to every sample_ref of a dataset: refs of recipe R become refs of
/// derive(R) (made once per upstream recipe and kept, so the pointers stay valid).
class recipe_map {
public:
  explicit recipe_map(std::function<std::shared_ptr<sample_recipe>(const sample_recipe&)> derive)
      : derive_(std::move(derive)) {}
  const sample_recipe* get(const sample_recipe* in) {
    std::lock_guard lock(mutex_);
    for (const auto& [from, to] : map_)
      if (from.get() == in) return to.get();
    auto made = derive_(*in);
    map_.emplace_back(in->shared_from_this(), made);
    return made.get();
  }

private:
  std::function<std::shared_ptr<sample_recipe>(const sample_recipe&)> derive_;
  std::mutex mutex_;
  std::vector<std::pair<std::shared_ptr<const sample_recipe>, std::shared_ptr<const sample_recipe>>> map_;
};

inline generator<sample_ref> remap_gen(generator<sample_ref> up, std::shared_ptr<recipe_map> m) {
  const sample_recipe* last_in = nullptr;
  const sample_recipe* last_out = nullptr;
  for (auto&& s : up) {
    if (!s.how) throw config_error("lockstep::data: an image stage got a sample_ref without a recipe");
    if (s.how != last_in) {
      last_in = s.how;
      last_out = m->get(s.how);
    }
    s.how = last_out;
    co_yield s;
  }
}

}  // namespace detail

/// Stage: appends an image_op to the recipe of every sample (see the named stages below).
struct image_stage : closure<image_stage> {
  std::shared_ptr<const image_op> op;  ///< the stage
  /// Applies the stage to an index-first dataset.
  dataset<sample_ref> operator()(dataset<sample_ref> d) const {
    auto m = std::make_shared<detail::recipe_map>([op = op](const sample_recipe& r) { return r.with_op(op); });
    return dataset<sample_ref>{[d = std::move(d), m](std::uint64_t e) { return detail::remap_gen(d.epoch(e), m); }};
  }
};

/// Stage: per-channel normalisation at staging (see normalize()).
struct normalize_stage : closure<normalize_stage> {
  std::vector<float> mean;    ///< per-channel means (or one for all)
  std::vector<float> stddev;  ///< per-channel standard deviations (or one for all)
  /// Applies the stage to an index-first dataset.
  dataset<sample_ref> operator()(dataset<sample_ref> d) const {
    auto m = std::make_shared<detail::recipe_map>(
        [mean = mean, sd = stddev](const sample_recipe& r) { return r.with_normalisation(mean, sd); });
    return dataset<sample_ref>{[d = std::move(d), m](std::uint64_t e) { return detail::remap_gen(d.epoch(e), m); }};
  }
};

namespace detail {

/// A random crop of h × w out of the image padded by `padding` pixels (of value 0) on every side.
class random_crop_op final : public image_op {
public:
  random_crop_op(std::uint32_t h, std::uint32_t w, std::uint32_t padding, std::uint64_t seed)
      : h_(h), w_(w), pad_(padding), seed_(seed) {}
  void apply(image_view& v, std::uint64_t epoch, std::uint64_t index) const override {
    const std::uint64_t ph = std::uint64_t{v.height} + 2ull * pad_, pw = std::uint64_t{v.width} + 2ull * pad_;
    if (ph < h_ || pw < w_)
      throw shape_error("lockstep::data::random_crop: a " + size_text(h_, w_) + " crop does not fit the " +
                        size_text(v.height, v.width) + " image padded by " + std::to_string(pad_));
    const sample_draws r(seed_, tag_random_crop, epoch, index);
    const double top = r.integer(0, static_cast<std::uint32_t>(ph - h_));
    const double left = r.integer(1, static_cast<std::uint32_t>(pw - w_));
    v.then({top - pad_, 1.0}, {left - pad_, 1.0}, h_, w_);
  }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> output_size() const override { return std::pair{h_, w_}; }
  std::string name() const override { return "random_crop(" + size_text(h_, w_) + ", padding " + std::to_string(pad_) + ")"; }

private:
  std::uint32_t h_, w_, pad_;
  std::uint64_t seed_;
};

}  // namespace detail

/// Options of random_resized_crop (torchvision's RandomResizedCrop defaults).
struct resized_crop_options {
  double min_scale = 0.08;        ///< smallest crop area as a fraction of the image's
  double max_scale = 1.0;         ///< largest crop area as a fraction of the image's
  double min_ratio = 3.0 / 4.0;   ///< smallest width / height of the crop
  double max_ratio = 4.0 / 3.0;   ///< largest width / height of the crop
};

namespace detail {

/// torchvision's RandomResizedCrop: up to 10 draws of an area fraction (uniform in [min_scale,
/// max_scale]) and an aspect ratio (log-uniform in [min_ratio, max_ratio]); the first crop that
/// fits is placed uniformly; else a centre crop with the ratio clamped. Then resized to h × w.
class random_resized_crop_op final : public image_op {
public:
  random_resized_crop_op(std::uint32_t h, std::uint32_t w, std::uint64_t seed, const resized_crop_options& o)
      : h_(h), w_(w), seed_(seed), o_(o) {}
  void apply(image_view& v, std::uint64_t epoch, std::uint64_t index) const override {
    const double H = v.height, W = v.width, area = H * W;
    const sample_draws r(seed_, tag_resized_crop, epoch, index);
    const double lr0 = std::log(o_.min_ratio), lr1 = std::log(o_.max_ratio);
    double ch = 0, cw = 0, top = 0, left = 0;
    bool found = false;
    for (std::uint64_t attempt = 0; attempt < 10 && !found; ++attempt) {
      const double target = area * (o_.min_scale + (o_.max_scale - o_.min_scale) * r.uniform(4 * attempt));
      const double ratio = std::exp(lr0 + (lr1 - lr0) * r.uniform(4 * attempt + 1));
      cw = std::round(std::sqrt(target * ratio));
      ch = std::round(std::sqrt(target / ratio));
      if (cw > 0 && ch > 0 && cw <= W && ch <= H) {
        top = r.integer(4 * attempt + 2, static_cast<std::uint32_t>(H - ch));
        left = r.integer(4 * attempt + 3, static_cast<std::uint32_t>(W - cw));
        found = true;
      }
    }
    if (!found) {
      const double in_ratio = W / H;
      if (in_ratio < o_.min_ratio) {
        cw = W;
        ch = std::round(W / o_.min_ratio);
      } else if (in_ratio > o_.max_ratio) {
        ch = H;
        cw = std::round(H * o_.max_ratio);
      } else {
        cw = W;
        ch = H;
      }
      ch = std::clamp(ch, 1.0, H);
      cw = std::clamp(cw, 1.0, W);
      top = std::floor((H - ch) / 2);
      left = std::floor((W - cw) / 2);
    }
    v.then({top, ch / h_}, {left, cw / w_}, h_, w_);
  }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> output_size() const override { return std::pair{h_, w_}; }
  std::string name() const override { return "random_resized_crop(" + size_text(h_, w_) + ")"; }

private:
  std::uint32_t h_, w_;
  std::uint64_t seed_;
  resized_crop_options o_;
};

/// Mirrors the image left-right with probability p.
class random_flip_op final : public image_op {
public:
  random_flip_op(std::uint64_t seed, double p) : seed_(seed), p_(p) {}
  void apply(image_view& v, std::uint64_t epoch, std::uint64_t index) const override {
    if (sample_draws(seed_, tag_flip, epoch, index).uniform(0) < p_) v.then({0, 1}, {double(v.width), -1}, v.height, v.width);
  }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> output_size() const override { return std::nullopt; }
  std::string name() const override { return "random_flip"; }

private:
  std::uint64_t seed_;
  double p_;
};

/// Scales the image to h × w.
class resize_op final : public image_op {
public:
  resize_op(std::uint32_t h, std::uint32_t w) : h_(h), w_(w) {}
  void apply(image_view& v, std::uint64_t, std::uint64_t) const override {
    v.then({0, double(v.height) / h_}, {0, double(v.width) / w_}, h_, w_);
  }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> output_size() const override { return std::pair{h_, w_}; }
  std::string name() const override { return "resize(" + size_text(h_, w_) + ")"; }

private:
  std::uint32_t h_, w_;
};

/// The centred h × w part (padded with 0 where the image is smaller).
class center_crop_op final : public image_op {
public:
  center_crop_op(std::uint32_t h, std::uint32_t w) : h_(h), w_(w) {}
  void apply(image_view& v, std::uint64_t, std::uint64_t) const override {
    const double top = std::floor((double(v.height) - h_) / 2), left = std::floor((double(v.width) - w_) / 2);
    v.then({top, 1}, {left, 1}, h_, w_);
  }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> output_size() const override { return std::pair{h_, w_}; }
  std::string name() const override { return "center_crop(" + size_text(h_, w_) + ")"; }

private:
  std::uint32_t h_, w_;
};

}  // namespace detail

/// A random height × width crop of the image padded by `padding` pixels of value 0 on each side
/// (torchvision's RandomCrop(size, padding)): top and left uniform over every position that fits,
/// keyed by (seed, epoch, sample index). @throws config_error for a zero size; shape_error at
/// decode when the crop does not fit the padded image.
inline image_stage random_crop(std::uint32_t height, std::uint32_t width, std::uint32_t padding, std::uint64_t seed) {
  detail::check_size("random_crop", height, width);
  return {{}, std::make_shared<detail::random_crop_op>(height, width, padding, seed)};
}

/// A random crop of random area and aspect ratio, resized bilinearly to height × width
/// (torchvision's RandomResizedCrop), keyed by (seed, epoch, sample index). Decoders that can
/// decode part of an image (JPEG) decode only what the crop reads. @throws config_error for a zero
/// size or bad ranges.
inline image_stage random_resized_crop(std::uint32_t height, std::uint32_t width, std::uint64_t seed,
                                       const resized_crop_options& o = {}) {
  detail::check_size("random_resized_crop", height, width);
  if (!(o.min_scale > 0) || !(o.min_scale <= o.max_scale) || !(o.max_scale <= 1) || !(o.min_ratio > 0) ||
      !(o.min_ratio <= o.max_ratio) || !std::isfinite(o.max_ratio))
    throw config_error("lockstep::data::random_resized_crop: need 0 < min_scale <= max_scale <= 1 and "
                       "0 < min_ratio <= max_ratio (finite)");
  return {{}, std::make_shared<detail::random_resized_crop_op>(height, width, seed, o)};
}

/// Mirrors the image left-right with probability `probability`, keyed by (seed, epoch, sample
/// index). @throws config_error unless 0 <= probability <= 1.
inline image_stage random_flip(std::uint64_t seed, double probability = 0.5) {
  if (!(probability >= 0 && probability <= 1))
    throw config_error("lockstep::data::random_flip: the probability must be in [0, 1]");
  return {{}, std::make_shared<detail::random_flip_op>(seed, probability)};
}

/// Scales the image bilinearly to height × width. @throws config_error for a zero size.
inline image_stage resize(std::uint32_t height, std::uint32_t width) {
  detail::check_size("resize", height, width);
  return {{}, std::make_shared<detail::resize_op>(height, width)};
}

/// The centred height × width part of the image (padded with 0 where it is smaller).
/// @throws config_error for a zero size.
inline image_stage center_crop(std::uint32_t height, std::uint32_t width) {
  detail::check_size("center_crop", height, width);
  return {{}, std::make_shared<detail::center_crop_op>(height, width)};
}

/// Per-channel normalisation when the rows are converted to float: channel c becomes
/// (v × scale − mean[c]) × (1 / stddev[c]) (1 / stddev rounded to float once). One value each
/// applies to every channel. @throws config_error (at the stage or when applied) unless the
/// counts match the source's channels and every stddev is finite and at least the smallest normal
/// float (a smaller one's reciprocal is infinite or near the float's limit).
inline normalize_stage normalize(std::vector<float> mean, std::vector<float> stddev) {
  if (mean.empty() || mean.size() != stddev.size())
    throw config_error("lockstep::data::normalize: give as many means as standard deviations (at least one)");
  return {{}, std::move(mean), std::move(stddev)};
}

}  // namespace lockstep::data
