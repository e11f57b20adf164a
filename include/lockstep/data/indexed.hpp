#pragma once
/// @file indexed.hpp
/// Index first, decode after the shard. An index-first source (an image folder, tar shards, a
/// .npy array, or any `sample_source`) yields `sample_ref`s: a dataset index, a label when
/// the index knows it, and how to load the sample. Shuffling, batching and the cut into shards work
/// on these references only; `batched` turns them into `index_batch`es, which hold the indices of
/// the global batch and decode nothing. When a batch is cut into shards — by `fit` (through
/// `detail::make_sharded` with the strategy's shard plan), `shard_batches` or `shard_by_worker` —
/// only the rows of the shards this process keeps are read, decoded and augmented, in parallel
/// (one task per replica shard, more when there are more load threads), and converted to float
/// ("staged"). Behind `prefetch`, batches are decoded ahead on the producer thread once the shard
/// plan is known (from the first cut of the epoch). So each worker and each replica decode only
/// the rows they train on, a resume that skips batches never opens their files, and the values of
/// every row are the same bits whatever the number of workers, replicas or load threads.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/batch_pool.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/detail/random.hpp>
#include <lockstep/data/detail/render.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/data/memory.hpp>
#include <lockstep/data/sample.hpp>

namespace lockstep::data {

/// Asked by a source, once it knows the size of a sample's image, which part of it the image
/// stages read (so a decoder may decode only that part).
class region_planner {
public:
  /// The region of a height × width image that the stages read (may be empty: all padding).
  [[nodiscard]] virtual pixel_rect plan(std::uint32_t height, std::uint32_t width) const = 0;

protected:
  ~region_planner() = default;
};

/// The reusable state of one loading thread, passed to every load it makes.
struct load_scratch {
  std::vector<std::uint8_t> bytes;  ///< a file's or archive member's bytes
  decoded_sample sample;            ///< the decoded sample
  std::shared_ptr<void> codec;      ///< a decoder's reusable state (its type is known to the source)
  detail::render_scratch render;    ///< buffers of the image stages
};

/// Counters of an index-first source and every pipeline built on it (updated by the loading
/// threads; read by `pipeline_report`).
struct pipeline_counters {
  std::atomic<std::uint64_t> opens{0};          ///< files opened to read samples
  std::atomic<std::uint64_t> bytes_read{0};     ///< bytes of samples read (files, archive members)
  std::atomic<std::uint64_t> index_bytes{0};    ///< bytes read to build the index (tar headers)
  std::atomic<std::uint64_t> samples{0};        ///< samples loaded (read and decoded)
  std::atomic<std::uint64_t> read_ns{0};        ///< time spent reading samples' bytes
  std::atomic<std::uint64_t> decode_ns{0};      ///< time spent decoding
  std::atomic<std::uint64_t> augment_ns{0};     ///< time spent in the image stages
  std::atomic<std::uint64_t> staged_rows{0};    ///< rows converted to float at the cut
  std::atomic<std::uint64_t> stage_ns{0};       ///< time spent converting them
  std::atomic<std::uint64_t> cut_batches{0};    ///< batches cut into shards
  std::atomic<std::uint64_t> cut_decoded{0};    ///< ... of which were decoded at the cut (not ahead)
  std::atomic<std::uint64_t> cut_wait_ns{0};    ///< time the consumer waited at the cut (decoding and staging)
  std::atomic<std::uint64_t> ahead_batches{0};  ///< batches decoded ahead (behind prefetch)
  std::atomic<std::uint64_t> ahead_ns{0};       ///< time the producer spent decoding ahead
  std::atomic<std::uint64_t> decoded_batch_bytes{0};  ///< bytes of the largest decoded batch (one process's rows)
};

namespace detail {

/// Nanoseconds since `t0`.
inline std::uint64_t ns_since(std::chrono::steady_clock::time_point t0) noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

/// Raises `a` to at least `v`.
inline void raise_to(std::atomic<std::uint64_t>& a, std::uint64_t v) noexcept {
  std::uint64_t cur = a.load();
  while (v > cur && !a.compare_exchange_weak(cur, v)) {
  }
}

/// Runs the tasks of fork-join jobs on a fixed set of threads; the calling thread works on its own
/// job too, so `threads` is the number of threads that load one batch. Several jobs may run at
/// once (decoding ahead on the producer while the consumer stages). Each thread has its own
/// load_scratch.
class load_pool {
public:
  explicit load_pool(std::size_t threads) : threads_(std::max<std::size_t>(threads, 1)) {
    workers_.reserve(threads_ - 1);
    try {
      for (std::size_t i = 1; i < threads_; ++i) workers_.emplace_back([this] { work(); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  load_pool(const load_pool&) = delete;
  load_pool& operator=(const load_pool&) = delete;
  ~load_pool() { shutdown(); }

  [[nodiscard]] std::size_t threads() const noexcept { return threads_; }

  /// Calls f(task, scratch) for every task in [0, tasks) and waits for all. If tasks throw, the
  /// exception of the lowest-numbered failing task is rethrown (every task runs regardless, so
  /// which error is reported does not depend on timing).
  template <class F>
  void run(std::size_t tasks, F&& f) {
    if (tasks == 0) return;
    job j;
    j.tasks = tasks;
    j.errors.resize(tasks);
    j.fn = [&f](std::size_t t, load_scratch& s) { f(t, s); };
    const bool shared = threads_ > 1 && tasks > 1;
    if (shared) {
      {
        std::lock_guard lock(mutex_);
        jobs_.push_back(&j);
      }
      work_cv_.notify_all();
    }
    {
      scratch_lease lease(*this);
      while (run_one(j, *lease.s)) {
      }
    }
    if (shared) {
      // No worker may pick the job any more; wait for the tasks and for every worker to let go.
      std::unique_lock lock(mutex_);
      std::erase(jobs_, &j);
      done_cv_.wait(lock, [&] { return j.done == j.tasks && j.holders == 0; });
    }
    for (auto& e : j.errors)
      if (e) std::rethrow_exception(e);
  }

private:
  struct job {
    std::size_t tasks = 0;
    std::atomic<std::size_t> next{0};
    std::size_t done = 0;     // guarded by mutex_
    std::size_t holders = 0;  // workers working on it, guarded by mutex_
    std::vector<std::exception_ptr> errors;
    std::function<void(std::size_t, load_scratch&)> fn;
  };
  // A scratch for a thread that calls run() (the pool's own workers keep theirs).
  struct scratch_lease {
    load_pool& p;
    std::unique_ptr<load_scratch> s;
    explicit scratch_lease(load_pool& pool) : p(pool) {
      std::lock_guard lock(p.mutex_);
      if (!p.spare_.empty()) {
        s = std::move(p.spare_.back());
        p.spare_.pop_back();
      }
      if (!s) s = std::make_unique<load_scratch>();
    }
    scratch_lease(const scratch_lease&) = delete;
    scratch_lease& operator=(const scratch_lease&) = delete;
    ~scratch_lease() {
      std::lock_guard lock(p.mutex_);
      try {
        p.spare_.push_back(std::move(s));
      } catch (...) {
      }
    }
  };

  // Claims and runs one task of j; false when none is left.
  bool run_one(job& j, load_scratch& s) {
    const std::size_t t = j.next.fetch_add(1);
    if (t >= j.tasks) return false;
    try {
      j.fn(t, s);
    } catch (...) {
      j.errors[t] = std::current_exception();
    }
    bool last = false;
    {
      std::lock_guard lock(mutex_);
      last = ++j.done == j.tasks;
    }
    if (last) done_cv_.notify_all();
    return true;
  }

  void work() {
    load_scratch scratch;
    std::unique_lock lock(mutex_);
    while (true) {
      job* pick = nullptr;
      work_cv_.wait(lock, [&] {
        if (stop_) return true;
        for (job* j : jobs_)
          if (j->next.load() < j->tasks) {
            pick = j;
            return true;
          }
        return false;
      });
      if (stop_) return;
      ++pick->holders;  // the job's owner waits for this to drop back before the job goes away
      lock.unlock();
      while (run_one(*pick, scratch)) {
      }
      lock.lock();
      if (--pick->holders == 0) done_cv_.notify_all();
    }
  }

  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
  }

  std::size_t threads_;
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<job*> jobs_;
  std::vector<std::unique_ptr<load_scratch>> spare_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

}  // namespace detail

/// The random-access side of an index-first source: how many samples there are, the labels the
/// index knows, and how to read and decode sample i. The library's sources implement it (image
/// folders, tar shards, .npy arrays, tables); a user may too, and wrap theirs with `indexed()`.
/// `load` is called concurrently from several threads and must not change the source.
class sample_source {
public:
  virtual ~sample_source() = default;
  /// Number of samples (dataset indices 0 .. size()-1).
  [[nodiscard]] virtual std::uint64_t size() const = 0;
  /// True when label(i) is sample i's label (known from the index); false when labels come with
  /// the data (decoded_sample::label) or there are none.
  [[nodiscard]] virtual bool labels_in_index() const { return false; }
  /// The label of sample i when labels_in_index(), else no_label.
  [[nodiscard]] virtual std::int32_t label(std::uint64_t i) const {
    (void)i;
    return no_label;
  }
  /// The group of sample i (a tar shard, a folder), which `interleave` cycles over. Samples of a
  /// group are consecutive in index order.
  [[nodiscard]] virtual std::uint32_t group(std::uint64_t i) const {
    (void)i;
    return 0;
  }
  /// True when samples are rows of float values (decoded_sample::values), false for uint8 images.
  [[nodiscard]] virtual bool float_rows() const { return false; }
  /// The channels of every sample's image (1 for rows of values).
  [[nodiscard]] virtual std::uint32_t channels() const = 0;
  /// The height × width of every sample when the source knows it without reading any data.
  [[nodiscard]] virtual std::optional<std::pair<std::uint32_t, std::uint32_t>> fixed_size() const {
    return std::nullopt;
  }
  /// Reads and decodes sample i into `out`. An image source calls `regions.plan(h, w)` once it
  /// knows the image's size and decodes at least the region it returns; it adds the bytes it
  /// reads and the files it opens to counters(). @throws data_error naming the file (and archive
  /// member) and the byte offset of what is wrong.
  virtual void load(std::uint64_t i, const region_planner& regions, decoded_sample& out, load_scratch& s) const = 0;
  /// The file or archive member of sample i, for messages.
  [[nodiscard]] virtual std::string name_of(std::uint64_t i) const { return "sample " + std::to_string(i); }
  /// One line describing the source (its kind, location and size) for the pipeline report.
  [[nodiscard]] virtual std::string describe() const = 0;
  /// The counters of this source and the pipelines built on it.
  [[nodiscard]] pipeline_counters& counters() const noexcept { return *counters_; }

private:
  std::shared_ptr<pipeline_counters> counters_ = std::make_shared<pipeline_counters>();
};

/// The most threads load_options::threads may ask for.
inline constexpr std::size_t max_load_threads = 1024;

/// Options of the loading that index-first sources share.
struct load_options {
  std::size_t threads = 0;  ///< threads that load one batch, the calling one included (0: the cores, at most 8; at most max_load_threads)
  std::pmr::memory_resource* memory = nullptr;  ///< where decoded rows live (nullptr: the heap); see batch_pool
};

namespace detail {

/// What every recipe derived from one source shares: the source, its load threads and the pool
/// of decoded-row buffers.
struct source_context {
  std::shared_ptr<const sample_source> source;
  std::shared_ptr<load_pool> pool;
  std::shared_ptr<batch_pool> buffers;

  source_context(std::shared_ptr<const sample_source> s, const load_options& o) : source(std::move(s)) {
    std::size_t n = o.threads;
    if (n > max_load_threads)
      throw config_error("lockstep::data: load_options::threads is " + std::to_string(n) + ", more than " +
                         std::to_string(max_load_threads));
    if (n == 0) n = std::clamp<std::size_t>(std::thread::hardware_concurrency(), 1, 8);
    pool = std::make_shared<load_pool>(n);
    buffers = std::make_shared<batch_pool>(16, o.memory);
  }
};

}  // namespace detail

/// One geometric image stage (crop, resize, flip): given the sample's key, it maps the current
/// image to a new one. See augment.hpp.
class image_op {
public:
  virtual ~image_op() = default;
  /// Applies the stage to view `v` of sample `index` in `epoch`.
  virtual void apply(detail::image_view& v, std::uint64_t epoch, std::uint64_t index) const = 0;
  /// The output height × width, when the stage fixes it.
  [[nodiscard]] virtual std::optional<std::pair<std::uint32_t, std::uint32_t>> output_size() const = 0;
  /// The stage's name, for messages.
  [[nodiscard]] virtual std::string name() const = 0;
};

/// How index-first samples are loaded: the source, the image stages applied after decoding, and
/// the per-channel normalisation applied when the rows are converted to float. Immutable; each
/// stage applied to an index dataset derives a new recipe.
class sample_recipe : public std::enable_shared_from_this<sample_recipe> {
public:
  /// The recipe that loads a source's samples as they are.
  explicit sample_recipe(std::shared_ptr<detail::source_context> ctx) : ctx_(std::move(ctx)) {}

  /// The source.
  [[nodiscard]] const sample_source& source() const noexcept { return *ctx_->source; }
  /// The shared context (source, load threads, buffers).
  [[nodiscard]] const std::shared_ptr<detail::source_context>& context() const noexcept { return ctx_; }
  /// The image stages in order.
  [[nodiscard]] const std::vector<std::shared_ptr<const image_op>>& ops() const noexcept { return ops_; }
  /// Per-channel means subtracted at staging (empty: none).
  [[nodiscard]] const std::vector<float>& mean() const noexcept { return mean_; }
  /// Per-channel reciprocals of the standard deviations multiplied at staging (empty: none).
  [[nodiscard]] const std::vector<float>& inv_std() const noexcept { return inv_std_; }

  /// A copy with one more image stage.
  [[nodiscard]] std::shared_ptr<sample_recipe> with_op(std::shared_ptr<const image_op> op) const {
    if (source().float_rows())
      throw config_error("lockstep::data: the image stage " + op->name() + " needs a source of images, but " +
                         source().describe() + " yields rows of float values");
    auto r = std::make_shared<sample_recipe>(*this);
    r->ops_.push_back(std::move(op));
    return r;
  }
  /// A copy that normalises channel c to (v - mean[c]) * (1 / std[c]) at staging (one value each
  /// for all channels, or one per channel).
  [[nodiscard]] std::shared_ptr<sample_recipe> with_normalisation(std::vector<float> mean, std::vector<float> stdev) const {
    const std::size_t c = source().channels();
    if (mean.size() != stdev.size() || (mean.size() != 1 && mean.size() != c))
      throw config_error("lockstep::data::normalize: " + std::to_string(mean.size()) + " means and " +
                         std::to_string(stdev.size()) + " standard deviations for " + std::to_string(c) +
                         " channels (give one of each, or one per channel)");
    auto r = std::make_shared<sample_recipe>(*this);
    r->mean_.assign(c, 0.0f);
    r->inv_std_.assign(c, 1.0f);
    for (std::size_t k = 0; k < c; ++k) {
      const float s = stdev[mean.size() == 1 ? 0 : k];
      // below the smallest normal float, 1 / s is infinite or so near the limit that values
      // away from the mean become +-inf
      if (!(s >= std::numeric_limits<float>::min()) || !std::isfinite(s) || !std::isfinite(mean[mean.size() == 1 ? 0 : k]))
        throw config_error("lockstep::data::normalize: channel " + std::to_string(k) +
                           " needs a finite mean and a finite standard deviation of at least 1.17549435e-38 (the "
                           "smallest normal float), got " + lockstep::detail::option_value(s));
      r->mean_[k] = mean[mean.size() == 1 ? 0 : k];
      r->inv_std_[k] = 1.0f / s;
    }
    return r;
  }

  /// The features per row when known before loading anything (a stage fixes the size, or the
  /// source knows it), else 0.
  [[nodiscard]] std::size_t known_width() const {
    const std::uint32_t c = source().channels();
    for (auto it = ops_.rbegin(); it != ops_.rend(); ++it)
      if (const auto hw = (*it)->output_size()) return std::size_t{c} * hw->first * hw->second;
    if (const auto hw = source().fixed_size()) return std::size_t{c} * hw->first * hw->second;
    return 0;
  }

  /// Loads sample `index` (of `epoch`) and writes its row of `width` values to dst (uint8 for
  /// image sources, float for float sources). Returns the label stored with the data, or no_label.
  /// @throws shape_error naming the sample when its row does not have `width` values; data_error
  ///         from the source.
  std::int32_t load(std::uint64_t index, std::uint64_t epoch, std::byte* dst, std::size_t width,
                    load_scratch& s) const {
    return load_impl(index, epoch, s, [&](std::size_t n, const std::string& what) {
      if (n != width) mismatch(index, what, width);
      return dst;
    });
  }
  /// Loads sample `index` (of `epoch`) into `out`, resized to its row (in bytes); returns the label
  /// stored with the data, or no_label. (How the first batch of a source learns the row width.)
  std::int32_t load_any(std::uint64_t index, std::uint64_t epoch, std::vector<std::byte>& out, load_scratch& s) const {
    const std::size_t elem = source().float_rows() ? sizeof(float) : 1;
    return load_impl(index, epoch, s, [&](std::size_t n, const std::string&) {
      out.resize(n * elem);
      return out.data();
    });
  }

private:
  // Computes the view of one sample through the stages once the source knows its size.
  struct planner final : region_planner {
    const sample_recipe& r;
    std::uint64_t epoch, index;
    detail::render_scratch& rs;
    mutable detail::image_view view;
    mutable bool planned = false;
    planner(const sample_recipe& rec, std::uint64_t e, std::uint64_t i, detail::render_scratch& s)
        : r(rec), epoch(e), index(i), rs(s) {}
    pixel_rect plan(std::uint32_t h, std::uint32_t w) const override {
      view = detail::image_view::of(h, w);
      for (const auto& op : r.ops_) {
        try {
          op->apply(view, epoch, index);
        } catch (const shape_error& e) {  // a stage that does not fit this image: name the file
          throw shape_error("lockstep::data: " + r.source().name_of(index) + ": " + e.what());
        }
      }
      planned = true;
      if (detail::is_identity(view)) return {0, 0, w, h};
      return detail::needed_region(view, rs);
    }
  };

  // Loads and renders one sample; dst_for(values, description) says where its row goes.
  template <class Dst>
  std::int32_t load_impl(std::uint64_t index, std::uint64_t epoch, load_scratch& s, Dst&& dst_for) const {
    const sample_source& src = source();
    pipeline_counters& k = src.counters();
    planner p(*this, epoch, index, s.render);
    s.sample.clear();
    src.load(index, p, s.sample, s);
    const decoded_sample& d = s.sample;
    const auto t0 = std::chrono::steady_clock::now();
    if (src.float_rows()) {
      std::byte* dst = dst_for(d.values.size(), std::to_string(d.values.size()) + " values");
      std::copy_n(d.values.data(), d.values.size(), reinterpret_cast<float*>(dst));
    } else {
      if (!p.planned) (void)p.plan(d.height, d.width);
      if (d.channels != src.channels())
        throw data_error("lockstep::data: " + src.name_of(index) + ": the decoder produced " +
                         std::to_string(d.channels) + " channels, the source promises " + std::to_string(src.channels()));
      // What render reads: `pixels` holds exactly the region, and the region lies in the image.
      const pixel_rect& r = d.region;
      if (std::uint64_t{r.x} + r.width > d.width || std::uint64_t{r.y} + r.height > d.height ||
          d.pixels.size() != std::size_t{r.width} * r.height * d.channels)
        throw data_error("lockstep::data: " + src.name_of(index) + ": the source produced " +
                         std::to_string(d.pixels.size()) + " bytes of pixels for the region of " +
                         std::to_string(r.width) + "x" + std::to_string(r.height) + " at (" + std::to_string(r.x) +
                         ", " + std::to_string(r.y) + ") of a " + std::to_string(d.width) + "x" +
                         std::to_string(d.height) + " image with " + std::to_string(d.channels) +
                         " channels (a region inside the image, width x height x channels bytes)");
      // Left as it is by the image stages, the image is read whole (render's copy).
      if (detail::is_identity(p.view) && (r.x != 0 || r.y != 0 || r.width != p.view.width || r.height != p.view.height))
        throw data_error("lockstep::data: " + src.name_of(index) + ": the source produced the region of " +
                         std::to_string(r.width) + "x" + std::to_string(r.height) + " at (" + std::to_string(r.x) +
                         ", " + std::to_string(r.y) + "), and the image stages read the whole " +
                         std::to_string(p.view.width) + "x" + std::to_string(p.view.height) +
                         " image (the region region_planner::plan returned)");
      const std::size_t n = std::size_t{d.channels} * p.view.height * p.view.width;
      std::byte* dst = dst_for(n, std::to_string(d.channels) + "x" + std::to_string(p.view.height) + "x" +
                                      std::to_string(p.view.width) + " (channels x height x width" +
                                      (ops_.empty() ? "" : " after the image stages") + ")");
      detail::render(d, p.view, reinterpret_cast<std::uint8_t*>(dst), s.render);
    }
    k.augment_ns += detail::ns_since(t0);
    ++k.samples;
    return d.label;
  }

  [[noreturn]] void mismatch(std::uint64_t index, const std::string& got, std::size_t width) const {
    throw shape_error("lockstep::data: " + source().name_of(index) + ": the sample is " + got +
                      ", but the rows of this batch have " + std::to_string(width) +
                      " values (images of different sizes need a resize or crop stage)");
  }

  std::shared_ptr<detail::source_context> ctx_;
  std::vector<std::shared_ptr<const image_op>> ops_;
  std::vector<float> mean_, inv_std_;
};

namespace detail {

/// The shard plan of one epoch of an index-first pipeline, learned at its first cut so that
/// batches behind prefetch can be decoded ahead for the same plan.
struct plan_slot {
  std::mutex mutex;
  bool known = false;
  std::size_t parts = 0, first = 0, count = 0;
  std::shared_ptr<plan_slot> slices;  // the plan of the epoch's slices (shard_by_worker), made at the first

  /// The plan the slices of this epoch's batches share: their own, since a slice's cut names its
  /// rows, not the batch's (a batch behind prefetch would be decoded ahead whole, for nothing).
  std::shared_ptr<plan_slot> slice_plan() {
    std::lock_guard lock(mutex);
    if (!slices) slices = std::make_shared<plan_slot>();
    return slices;
  }
};

/// Decoded rows [lo, hi) of one index batch for one plan (uint8 or float), with their labels.
struct decoded_rows {
  std::size_t parts = 0, first = 0, count = 0;  // the plan they were decoded for
  std::size_t lo = 0, hi = 0, width = 0;
  bool floats = false;
  row_buffer rows;
  std::vector<std::int32_t> labels;  // labels read with the data (empty when none)
};

/// What the batches of one `batched` stage share: the float batch pool and the row width learned
/// by the first cut that loads a row, when the recipe does not fix it.
struct index_stage {
  std::shared_ptr<batch_pool> floats = std::make_shared<batch_pool>();
  std::atomic<std::size_t> width{0};
};

/// The per-row bookkeeping of an index batch beyond its indices and labels.
struct index_rows {
  std::vector<std::uint64_t> epochs;
  std::vector<float> scales;
  std::vector<const sample_recipe*> recipes;
  std::vector<std::shared_ptr<const sample_recipe>> owners;  // the distinct recipes (usually one)
  std::shared_ptr<plan_slot> plan;
  std::shared_ptr<index_stage> stage;
  std::mutex ahead_mutex;
  std::shared_ptr<decoded_rows> ahead;  // decoded ahead for the plan it names
};

/// The rows [offset, offset + size) that part `rank` of `parts` gets from `rows` rows (as split()).
inline std::pair<std::size_t, std::size_t> plan_part(std::size_t rows, std::size_t rank, std::size_t parts) noexcept {
  const std::size_t base = rows / parts, extra = rows % parts;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

inline void check_plan(std::size_t parts, std::size_t first, std::size_t count) {
  if (parts == 0 || count == 0 || first + count > parts)
    throw config_error("lockstep::data: cannot take shards " + std::to_string(first) + ".." +
                       std::to_string(first + count) + " of " + std::to_string(parts));
}

}  // namespace detail

class index_batch;

namespace detail {
generator<index_batch> index_batch_gen(generator<sample_ref> up, std::size_t size, bool drop_remainder,
                                       std::shared_ptr<index_stage> stage);
index_batch batch_for_pass(const index_batch& b, std::shared_ptr<plan_slot> plan, std::uint64_t filled,
                           std::uint64_t epoch);

/// The key of a cached sample's random image draws when cache() gives it in epoch `epoch`, the
/// pass that filled the cache having run in epoch `filled`: its source epoch in that epoch; in
/// another, `epoch` when the source epoch was `filled` (a source read once per epoch: the draws
/// are those of the pipeline without cache(), whichever epoch filled it, so a resumed run draws
/// as an uninterrupted one), else a key mixed from (source epoch, epoch) (a `repeat` before
/// cache(): its repetitions keep distinct draws). The draws are new each epoch.
constexpr std::uint64_t replay_epoch(std::uint64_t source, std::uint64_t filled, std::uint64_t epoch) noexcept {
  if (epoch == filled) return source;
  if (source == filled) return epoch;
  return mix64(source ^ mix64(epoch ^ 0x6361636865ull));  // "cache"
}
}  // namespace detail

/// A global batch of an index-first pipeline: `indices` lists its rows' dataset indices, `labels`
/// their labels when the source's index knows them; nothing is loaded. Cutting it into shards
/// (`load_shards`, which `detail::make_sharded` calls) loads, decodes and stages the rows of the
/// shards kept, and nothing else. Copies share the rows decoded ahead.
class index_batch : public batch {
public:
  /// An empty batch.
  index_batch() = default;

  /// Cuts the batch into `parts` shards (as split()) and keeps `count` of them from `first` (one
  /// process's replicas), loading, decoding and staging only their rows, in parallel: the values
  /// of the returned shards are the same bits for any plan. The returned global batch lists every
  /// row's index but holds the values of the kept rows only (batch::first_held).
  /// @throws config_error for an impossible plan; shape_error and data_error from the samples.
  [[nodiscard]] distributed_batch load_shards(std::size_t parts, std::size_t first, std::size_t count) const {
    detail::check_plan(parts, first, count);
    if (!rows_ || rows() == 0) return empty_cut(parts, first, count);
    pipeline_counters& k = counters();
    const auto t0 = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(rows_->plan->mutex);
      if (!rows_->plan->known) {
        rows_->plan->known = true;
        rows_->plan->parts = parts;
        rows_->plan->first = first;
        rows_->plan->count = count;
      }
    }
    std::shared_ptr<detail::decoded_rows> d;
    {
      std::lock_guard lock(rows_->ahead_mutex);
      if (rows_->ahead && rows_->ahead->parts == parts && rows_->ahead->first == first && rows_->ahead->count == count)
        d = rows_->ahead;
    }
    if (!d) {
      d = decode(parts, first, count);
      ++k.cut_decoded;
    }
    distributed_batch out = stage(*d);
    k.cut_wait_ns += detail::ns_since(t0);
    ++k.cut_batches;
    return out;
  }

  /// Decodes the rows of this process's shards now, for the plan learned at the first cut of this
  /// batch's epoch (nothing when no batch of the epoch was cut yet, or when already done).
  /// `prefetch` calls it on its producer thread, so decoding overlaps training.
  void load_ahead() {
    if (!rows_ || rows() == 0) return;
    std::size_t parts = 0, first = 0, count = 0;
    {
      std::lock_guard lock(rows_->plan->mutex);
      if (!rows_->plan->known) return;
      parts = rows_->plan->parts;
      first = rows_->plan->first;
      count = rows_->plan->count;
    }
    {
      std::lock_guard lock(rows_->ahead_mutex);
      if (rows_->ahead) return;
    }
    // A width the recipe does not fix is learned by the first cut, on the consumer's thread.
    if (width_now() == 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    auto d = decode(parts, first, count);
    {
      std::lock_guard lock(rows_->ahead_mutex);
      rows_->ahead = std::move(d);
    }
    pipeline_counters& k = counters();
    k.ahead_ns += detail::ns_since(t0);
    ++k.ahead_batches;
  }

  /// Rows [offset, offset + size) as an index batch of their own (what shard_by_worker keeps).
  [[nodiscard]] index_batch slice(std::size_t offset, std::size_t size) const {
    index_batch b;
    const auto sub = [&](const auto& v, auto& out) {
      if (v.empty()) return;
      out.assign(v.begin() + static_cast<std::ptrdiff_t>(offset), v.begin() + static_cast<std::ptrdiff_t>(offset + size));
    };
    sub(indices, b.indices);
    sub(labels, b.labels);
    if (rows_) {
      b.rows_ = std::make_shared<detail::index_rows>();
      detail::index_rows& r = *b.rows_;
      sub(rows_->epochs, r.epochs);
      sub(rows_->scales, r.scales);
      sub(rows_->recipes, r.recipes);
      r.owners = rows_->owners;
      r.stage = rows_->stage;
      r.plan = rows_->plan->slice_plan();  // the slices of an epoch's batches are cut alike: they share a plan
    }
    return b;
  }

private:
  // The row width: fixed by the recipe, else the one the stage has learned (0: not learned yet).
  [[nodiscard]] std::size_t width_now() const {
    const std::size_t fixed = rows_->owners.front()->known_width();
    return fixed ? fixed : rows_->stage->width.load();
  }

  // The counters of the batch's source (only for a batch with rows: each row adds its recipe).
  [[nodiscard]] pipeline_counters& counters() const noexcept { return rows_->owners.front()->source().counters(); }

  friend generator<index_batch> detail::index_batch_gen(generator<sample_ref>, std::size_t, bool,
                                                        std::shared_ptr<detail::index_stage>);
  friend index_batch detail::batch_for_pass(const index_batch&, std::shared_ptr<detail::plan_slot>, std::uint64_t,
                                            std::uint64_t);

  distributed_batch empty_cut(std::size_t parts, std::size_t first, std::size_t count) const {
    auto g = std::make_shared<batch>();
    g->indices = indices;
    g->labels = labels;
    distributed_batch out;
    out.shards.resize(count);
    for (std::size_t r = 0; r < count; ++r) {
      const auto [offset, size] = detail::plan_part(g->rows(), first + r, parts);
      out.shards[r].offset = offset;
      out.shards[r].size = size;
      out.shards[r].indices = g->indices.data() + offset;
      out.shards[r].global_size = g->rows();
    }
    out.global = std::move(g);
    return out;
  }

  /// Loads rows [lo, hi) of the plan: one task per replica shard, each cut into pieces when there
  /// are more load threads than shards.
  std::shared_ptr<detail::decoded_rows> decode(std::size_t parts, std::size_t first, std::size_t count) const {
    const std::size_t n = rows();
    const std::size_t lo = detail::plan_part(n, first, parts).first;
    const auto last = detail::plan_part(n, first + count - 1, parts);
    const std::size_t hi = last.first + last.second;
    const sample_recipe& head = *rows_->owners.front();
    const auto& ctx = head.context();
    const bool floats = head.source().float_rows();
    const std::size_t elem = floats ? sizeof(float) : 1;
    auto d = std::make_shared<detail::decoded_rows>();
    d->parts = parts;
    d->first = first;
    d->count = count;
    d->lo = lo;
    d->hi = hi;
    d->floats = floats;
    if (hi == lo) {  // this process's shards are empty: nothing to load
      d->width = width_now();
      return d;
    }
    const bool labels_from_data = labels.empty();
    if (labels_from_data) d->labels.assign(hi - lo, no_label);
    // The row width: fixed by the recipe, or learned once, by the first cut that loads a row
    // (load_ahead does not decode until then, so no other thread learns another), from its first
    // row (loaded here once, then copied in): this process loads no row outside its shards.
    std::size_t width = width_now();
    std::size_t start = lo;
    std::vector<std::byte> first_row;
    if (width == 0) {
      load_scratch s;
      const std::int32_t l = rows_->recipes[lo]->load_any(indices[lo], rows_->epochs[lo], first_row, s);
      width = first_row.size() / elem;
      if (labels_from_data) d->labels[0] = l;
      rows_->stage->width.store(width);
      start = lo + 1;
    }
    d->width = width;
    d->rows = ctx->buffers->acquire_rows(std::max<std::size_t>((hi - lo) * width * elem, 1));
    detail::raise_to(counters().decoded_batch_bytes, (hi - lo) * width * elem);
    std::byte* base = d->rows.data();
    if (start != lo) std::copy(first_row.begin(), first_row.end(), base);
    const std::size_t threads = ctx->pool->threads();
    const std::size_t split = std::max<std::size_t>(1, (threads + count - 1) / count);
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    pieces.reserve(count * split);
    for (std::size_t r = 0; r < count; ++r) {
      const auto [off, size] = detail::plan_part(n, first + r, parts);
      const std::size_t a0 = std::max(off, start), b0 = off + size;
      if (b0 <= a0) continue;
      for (std::size_t q = 0; q < split; ++q) {
        const std::size_t a = a0 + (b0 - a0) * q / split, b = a0 + (b0 - a0) * (q + 1) / split;
        if (b > a) pieces.emplace_back(a, b);
      }
    }
    ctx->pool->run(pieces.size(), [&](std::size_t t, load_scratch& s) {
      for (std::size_t row = pieces[t].first; row < pieces[t].second; ++row) {
        const std::int32_t l =
            rows_->recipes[row]->load(indices[row], rows_->epochs[row], base + (row - lo) * width * elem, width, s);
        if (labels_from_data) d->labels[row - lo] = l;
      }
    });
    if (labels_from_data) {
      const auto is_labelled = [](std::int32_t l) { return l != no_label; };
      if (std::none_of(d->labels.begin(), d->labels.end(), is_labelled)) {
        d->labels.clear();
      } else {
        for (std::size_t row = lo; row < hi; ++row)
          if (d->labels[row - lo] == no_label)
            throw data_error("lockstep::data: " + rows_->recipes[row]->source().name_of(indices[row]) +
                             ": the sample has no label, but other samples of its batch have one");
      }
    }
    return d;
  }

  // Converts the decoded rows to float (scale, then the per-channel normalisation) into a pooled
  // global batch and cuts the kept shards from it.
  distributed_batch stage(const detail::decoded_rows& d) const {
    pipeline_counters& k = counters();
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t n = rows(), held = d.hi - d.lo, width = d.width;
    pooled_batch g(rows_->stage->floats->acquire(), rows_->stage->floats);
    g.indices.assign(indices.begin(), indices.end());
    g.width = width;
    g.target_width = 0;
    g.targets.clear();
    g.first_held = d.lo;
    g.held_rows = held;
    g.features.resize(held * width);
    if (!labels.empty())
      g.labels.assign(labels.begin() + static_cast<std::ptrdiff_t>(d.lo), labels.begin() + static_cast<std::ptrdiff_t>(d.hi));
    else
      g.labels.assign(d.labels.begin(), d.labels.end());
    for (std::size_t row = d.lo; row < d.hi; ++row) {
      const sample_recipe& r = *rows_->recipes[row];
      float* out = g.features.data() + (row - d.lo) * width;
      const float scale = rows_->scales[row];
      if (!r.mean().empty()) {  // (v * scale - mean) * (1 / std), channel by channel, in one pass
        const std::size_t c = r.mean().size(), plane = width / c;
        for (std::size_t ch = 0; ch < c; ++ch) {
          const float m = r.mean()[ch], is = r.inv_std()[ch];
          float* p = out + ch * plane;
          if (d.floats) {
            const float* in = d.rows.as<float>() + (row - d.lo) * width + ch * plane;
            for (std::size_t j = 0; j < plane; ++j) p[j] = (in[j] * scale - m) * is;
          } else {
            const std::uint8_t* in = d.rows.as<std::uint8_t>() + (row - d.lo) * width + ch * plane;
            for (std::size_t j = 0; j < plane; ++j) p[j] = (static_cast<float>(in[j]) * scale - m) * is;
          }
        }
      } else if (d.floats) {
        const float* in = d.rows.as<float>() + (row - d.lo) * width;
        if (scale == 1.0f)
          std::copy_n(in, width, out);
        else
          detail::scale_row(in, out, width, scale);
      } else {
        detail::convert_row(d.rows.as<std::uint8_t>() + (row - d.lo) * width, out, width, scale);
      }
    }
    k.staged_rows += held;
    k.stage_ns += detail::ns_since(t0);
    auto owned = std::make_shared<const pooled_batch>(std::move(g));
    const batch& gb = *owned;
    distributed_batch out;
    out.shards.resize(d.count);
    for (std::size_t r = 0; r < d.count; ++r) {
      const auto [offset, size] = detail::plan_part(n, d.first + r, d.parts);
      shard& s = out.shards[r];
      s.features = gb.features.data() + (offset - d.lo) * width;
      s.labels = gb.labels.empty() ? nullptr : gb.labels.data() + (offset - d.lo);
      s.targets = nullptr;
      s.indices = gb.indices.data() + offset;
      s.size = size;
      s.width = width;
      s.target_width = 0;
      s.offset = offset;
      s.global_size = n;
    }
    out.global = std::move(owned);
    return out;
  }

  std::shared_ptr<detail::index_rows> rows_;
};

/// True for batch types that load their rows when cut into shards (index_batch and types derived
/// from it).
template <class B>
concept deferred_batch = std::derived_from<std::remove_cvref_t<B>, index_batch>;

namespace detail {

/// Groups `size` consecutive index-first samples into an index_batch (`batched` on a dataset of
/// sample_ref).
inline generator<index_batch> index_batch_gen(generator<sample_ref> up, std::size_t size, bool drop_remainder,
                                              std::shared_ptr<index_stage> stage) {
  auto plan = std::make_shared<plan_slot>();  // one per epoch
  index_batch b;
  std::size_t rows = 0;
  bool labelled = false;
  for (auto&& s : up) {
    if (!s.how)
      throw config_error("lockstep::data::batched: sample_ref " + std::to_string(s.index) + " has no recipe");
    if (rows == 0) {
      b = index_batch();
      b.rows_ = std::make_shared<index_rows>();
      b.rows_->plan = plan;
      b.rows_->stage = stage;
      b.indices.reserve(size);
      b.rows_->epochs.reserve(size);
      b.rows_->scales.reserve(size);
      b.rows_->recipes.reserve(size);
      labelled = s.label != no_label;
      if (labelled) b.labels.reserve(size);
    } else if ((s.label != no_label) != labelled) {
      throw data_error("lockstep::data::batched: " + s.how->source().name_of(s.index) +
                       (labelled ? " has no label in a labelled batch" : " has a label in an unlabelled batch"));
    }
    index_rows& r = *b.rows_;
    if (r.recipes.empty() || r.recipes.back() != s.how) {
      const auto same = [&](const std::shared_ptr<const sample_recipe>& o) { return o.get() == s.how; };
      if (std::none_of(r.owners.begin(), r.owners.end(), same)) {
        if (!r.owners.empty() && r.owners.front()->source().float_rows() != s.how->source().float_rows())
          throw shape_error("lockstep::data::batched: " + s.how->source().name_of(s.index) +
                            ": a batch cannot mix samples of float rows and of images");
        r.owners.push_back(s.how->shared_from_this());
      }
    }
    b.indices.push_back(s.index);
    if (labelled) b.labels.push_back(s.label);
    r.epochs.push_back(s.epoch);
    r.scales.push_back(s.scale);
    r.recipes.push_back(s.how);
    if (++rows == size) {
      rows = 0;
      co_yield std::move(b);
    }
  }
  if (rows > 0 && !drop_remainder) co_yield std::move(b);
}

/// A copy of `b` that shares nothing decoded with it, for cache(): the shard plan `plan` (one per
/// pass, shared by the pass's batches), no rows decoded ahead, and each row's epoch
/// replay_epoch(its epoch, filled, epoch).
inline index_batch batch_for_pass(const index_batch& b, std::shared_ptr<plan_slot> plan, std::uint64_t filled,
                                  std::uint64_t epoch) {
  index_batch out;
  out.indices = b.indices;
  out.labels = b.labels;
  if (!b.rows_) return out;
  out.rows_ = std::make_shared<index_rows>();
  index_rows& r = *out.rows_;
  r.epochs = b.rows_->epochs;
  for (std::uint64_t& e : r.epochs) e = replay_epoch(e, filled, epoch);
  r.scales = b.rows_->scales;
  r.recipes = b.rows_->recipes;
  r.owners = b.rows_->owners;
  r.stage = b.rows_->stage;
  r.plan = std::move(plan);
  return out;
}

}  // namespace detail

namespace detail {

inline generator<sample_ref> indexed_gen(std::shared_ptr<const sample_recipe> r, std::uint64_t epoch) {
  const sample_source& src = r->source();
  const std::uint64_t n = src.size();
  const bool labels = src.labels_in_index();
  for (std::uint64_t i = 0; i < n; ++i) {
    sample_ref s;
    s.index = i;
    s.epoch = epoch;
    s.label = labels ? src.label(i) : no_label;
    s.group = src.group(i);
    s.how = r.get();
    co_yield s;
  }
}

}  // namespace detail

/// A snapshot of an index-first pipeline's counters, with rates, printable as a small table.
struct pipeline_report {
  std::string source;                ///< the source's description
  std::size_t threads = 0;           ///< load threads
  std::uint64_t samples = 0;         ///< samples loaded
  std::uint64_t opens = 0;           ///< files opened to read samples
  std::uint64_t bytes_read = 0;      ///< bytes of samples read
  std::uint64_t index_bytes = 0;     ///< bytes read to build the index
  double read_s = 0;                 ///< thread-seconds reading
  double decode_s = 0;               ///< thread-seconds decoding
  double augment_s = 0;              ///< thread-seconds in the image stages
  std::uint64_t staged_rows = 0;     ///< rows converted to float
  double stage_s = 0;                ///< seconds converting them
  std::uint64_t cut_batches = 0;     ///< batches cut
  std::uint64_t cut_decoded = 0;     ///< ... decoded at the cut
  double cut_wait_s = 0;             ///< seconds the consumer waited at the cut
  std::uint64_t ahead_batches = 0;   ///< batches decoded ahead
  double ahead_s = 0;                ///< seconds the producer spent decoding ahead
  std::size_t decoded_batch_bytes = 0;  ///< bytes of the largest decoded batch
  std::size_t row_buffer_bytes = 0;     ///< bytes of decoded-row buffers held now
  std::size_t peak_row_buffer_bytes = 0;  ///< their peak

  /// The report as a few lines of text.
  [[nodiscard]] std::string text() const {
    auto rate = [](std::uint64_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; };
    std::string out = "pipeline report: " + source + ", " + std::to_string(threads) + " load thread(s)\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %-22s %10s %10s %14s\n", "stage", "samples", "busy s", "samples/s/thread");
    out += line;
    const auto row = [&](const char* name, std::uint64_t n, double s) {
      std::snprintf(line, sizeof line, "  %-22s %10llu %10.3f %14.0f\n", name, static_cast<unsigned long long>(n), s,
                    rate(n, s));
      out += line;
    };
    row("read", samples, read_s);
    row("decode", samples, decode_s);
    row("image stages", samples, augment_s);
    row("stage to float", staged_rows, stage_s);
    std::snprintf(line, sizeof line,
                  "  cut into shards: %llu batches (%llu decoded at the cut, %llu ahead); consumer waited %.3f s, "
                  "producer decoded ahead %.3f s\n",
                  static_cast<unsigned long long>(cut_batches), static_cast<unsigned long long>(cut_decoded),
                  static_cast<unsigned long long>(ahead_batches), cut_wait_s, ahead_s);
    out += line;
    std::snprintf(line, sizeof line, "  files opened %llu, sample bytes read %llu, index bytes read %llu\n",
                  static_cast<unsigned long long>(opens), static_cast<unsigned long long>(bytes_read),
                  static_cast<unsigned long long>(index_bytes));
    out += line;
    std::snprintf(line, sizeof line,
                  "  memory: decoded-row buffers %.1f MiB now, %.1f MiB at most; largest decoded batch %.1f MiB\n",
                  static_cast<double>(row_buffer_bytes) / 1048576.0, static_cast<double>(peak_row_buffer_bytes) / 1048576.0,
                  static_cast<double>(decoded_batch_bytes) / 1048576.0);
    out += line;
    return out;
  }
};

/// An index-first source as a dataset of sample_ref (epoch e yields indices 0 .. size()-1 in
/// order), with access to the source and its pipeline report. Stages apply to it like to any
/// dataset (`source | shuffle(n, seed) | batched(256)`).
class indexed_dataset : public dataset<sample_ref> {
public:
  /// Wraps a source with the given loading options.
  indexed_dataset(std::shared_ptr<const sample_source> src, const load_options& o = {})
      : indexed_dataset(std::make_shared<sample_recipe>(std::make_shared<detail::source_context>(std::move(src), o))) {}

  /// Number of samples.
  [[nodiscard]] std::uint64_t size() const { return recipe_->source().size(); }
  /// The source.
  [[nodiscard]] const sample_source& source() const noexcept { return recipe_->source(); }
  /// The counters of the source and every pipeline built on it.
  [[nodiscard]] pipeline_counters& counters() const noexcept { return recipe_->source().counters(); }
  /// A snapshot of the counters (per stage: samples, busy time, rate; time waiting; memory).
  [[nodiscard]] pipeline_report report() const {
    const pipeline_counters& k = counters();
    pipeline_report r;
    r.source = source().describe();
    r.threads = recipe_->context()->pool->threads();
    r.samples = k.samples.load();
    r.opens = k.opens.load();
    r.bytes_read = k.bytes_read.load();
    r.index_bytes = k.index_bytes.load();
    r.read_s = static_cast<double>(k.read_ns.load()) * 1e-9;
    r.decode_s = static_cast<double>(k.decode_ns.load()) * 1e-9;
    r.augment_s = static_cast<double>(k.augment_ns.load()) * 1e-9;
    r.staged_rows = k.staged_rows.load();
    r.stage_s = static_cast<double>(k.stage_ns.load()) * 1e-9;
    r.cut_batches = k.cut_batches.load();
    r.cut_decoded = k.cut_decoded.load();
    r.cut_wait_s = static_cast<double>(k.cut_wait_ns.load()) * 1e-9;
    r.ahead_batches = k.ahead_batches.load();
    r.ahead_s = static_cast<double>(k.ahead_ns.load()) * 1e-9;
    r.decoded_batch_bytes = static_cast<std::size_t>(k.decoded_batch_bytes.load());
    r.row_buffer_bytes = recipe_->context()->buffers->row_bytes();
    r.peak_row_buffer_bytes = recipe_->context()->buffers->peak_row_bytes();
    return r;
  }

private:
  explicit indexed_dataset(std::shared_ptr<const sample_recipe> r)
      : dataset<sample_ref>([r](std::uint64_t e) { return detail::indexed_gen(r, e); }), recipe_(std::move(r)) {}
  std::shared_ptr<const sample_recipe> recipe_;
};

/// A user's sample_source as an index-first dataset.
inline indexed_dataset indexed(std::shared_ptr<const sample_source> source, const load_options& o = {}) {
  return indexed_dataset(std::move(source), o);
}

/// A decoded table (IDX, memory) as a sample_source: loading copies a row. uint8 rows are images
/// of channels × height × width (channels-first; by default 1 × 1 × width), float rows stay rows.
class table_source final : public sample_source {
public:
  /// The rows of `t`, as images of the given shape (0 × 0 × 0: 1 × 1 × width).
  /// @throws data_error when the table is inconsistent; config_error when the shape does not
  ///         multiply to the row width, or when the table has regression targets (an index-first
  ///         batch carries class labels only: from_table keeps the targets).
  explicit table_source(std::shared_ptr<const table> t, std::uint32_t channels = 0, std::uint32_t height = 0,
                        std::uint32_t width = 0)
      : t_(std::move(t)), c_(channels), h_(height), w_(width) {
    detail::check_table(*t_, "table_source");
    if (t_->target_width > 0)
      throw config_error("lockstep::data::table_source: the table has regression targets (" +
                         std::to_string(t_->target_width) + " per row), which index-first batches do not carry (they "
                         "would be dropped); read it with data::from_table (or from_memory), whose batches keep them");
    if (c_ == 0 && h_ == 0 && w_ == 0) {
      c_ = 1;
      h_ = 1;
      w_ = static_cast<std::uint32_t>(t_->width);
    }
    if (std::size_t{c_} * h_ * w_ != t_->width || (c_ > 1 && t_->bytes.empty()))
      throw config_error("lockstep::data::table_source: a " + std::to_string(c_) + " x " + std::to_string(h_) + " x " +
                         std::to_string(w_) + " image does not match rows of " + std::to_string(t_->width) +
                         (t_->bytes.empty() ? " float values (float rows have one channel)" : " values"));
  }
  std::uint64_t size() const override { return t_->rows; }
  bool labels_in_index() const override { return !t_->labels.empty(); }
  std::int32_t label(std::uint64_t i) const override { return t_->labels.empty() ? no_label : t_->labels[i]; }
  bool float_rows() const override { return t_->bytes.empty(); }
  std::uint32_t channels() const override { return c_; }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> fixed_size() const override { return std::pair{h_, w_}; }
  void load(std::uint64_t i, const region_planner& regions, decoded_sample& out, load_scratch&) const override {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t w = t_->width;
    if (t_->bytes.empty()) {
      const float* row = t_->values.data() + i * w;
      out.values.assign(row, row + w);
      out.channels = 1;
      out.height = 1;
      out.width = static_cast<std::uint32_t>(w);
    } else {
      const std::uint8_t* row = t_->bytes.data() + t_->byte_offset + i * w;
      out.channels = c_;
      out.height = h_;
      out.width = w_;
      (void)regions.plan(h_, w_);
      out.region = {0, 0, w_, h_};
      out.pixels.resize(w);
      const std::size_t plane = std::size_t{h_} * w_;
      if (c_ == 1) {
        std::copy_n(row, w, out.pixels.data());
      } else {
        for (std::size_t p = 0; p < plane; ++p)
          for (std::size_t c = 0; c < c_; ++c) out.pixels[p * c_ + c] = row[c * plane + p];
      }
    }
    counters().bytes_read += w * (t_->bytes.empty() ? sizeof(float) : 1);
    counters().read_ns += detail::ns_since(t0);
  }
  std::string describe() const override {
    return "table of " + std::to_string(t_->rows) + " rows of " + std::to_string(t_->width) +
           (t_->bytes.empty() ? " float values" : " uint8 values");
  }

private:
  std::shared_ptr<const table> t_;
  std::uint32_t c_, h_, w_;
};

/// A decoded table as an index-first dataset: rows are copied when their batch is cut (of use to
/// run the image stages on in-memory images, and to compare with the other index-first sources).
/// A table with regression targets is refused (table_source).
inline indexed_dataset indexed(std::shared_ptr<const table> t, std::uint32_t channels = 0, std::uint32_t height = 0,
                               std::uint32_t width = 0, const load_options& o = {}) {
  return indexed_dataset(std::make_shared<table_source>(std::move(t), channels, height, width), o);
}

}  // namespace lockstep::data
