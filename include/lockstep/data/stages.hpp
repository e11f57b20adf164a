#pragma once
/// @file stages.hpp
/// The synchronous pipeline stages: map, filter, shuffle, batch, repeat, take, skip, cache.
/// Each is a closure: `dataset | stage` gives a new dataset, `stage | stage` a new closure.

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/batch_pool.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/detail/random.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/data/indexed.hpp>
#include <lockstep/data/sample.hpp>

namespace lockstep::data {

namespace detail {

template <class T, class R, class F>
generator<R> map_gen(generator<T> up, F f) {
  for (auto&& x : up) co_yield static_cast<R>(std::invoke(f, std::move(x)));
}

template <class T, class P>
generator<T> filter_gen(generator<T> up, P pred) {
  for (auto&& x : up)
    if (std::invoke(pred, std::as_const(x))) co_yield std::move(x);
}

template <class T>
generator<T> take_gen(generator<T> up, std::uint64_t n) {
  if (n == 0) co_return;
  std::uint64_t i = 0;
  for (auto&& x : up) {
    co_yield std::move(x);
    if (++i == n) co_return;  // never pull one element more than needed
  }
}

template <class T>
generator<T> skip_gen(generator<T> up, std::uint64_t n) {
  std::uint64_t i = 0;
  for (auto&& x : up) {
    if (i < n) {
      ++i;
      continue;
    }
    co_yield std::move(x);
  }
}

template <class T>
generator<T> repeat_gen(dataset<T> up, std::optional<std::uint64_t> times, std::uint64_t epoch) {
  // Epoch e is upstream epochs e*k .. e*k+k-1: a product past 2^64 would wrap onto earlier ones.
  if (times && *times > 1 && epoch > (~std::uint64_t{0} - (*times - 1)) / *times)
    throw config_error("lockstep::data::repeat(" + std::to_string(*times) + "): epoch " + std::to_string(epoch) +
                       " maps past upstream epoch 2^64 - 1 (epoch x k + k - 1 overflows)");
  for (std::uint64_t r = 0; !times || r < *times; ++r) {
    const std::uint64_t inner = times ? epoch * *times + r : (epoch << 32) + r;
    bool any = false;
    for (auto&& x : up.epoch(inner)) {
      any = true;
      co_yield std::move(x);
    }
    if (!any && !times) co_return;  // an empty dataset repeated forever is empty, not an endless loop
  }
}

/// Free list of vectors (keeps the shuffle buffer's memory from one epoch to the next).
template <class T>
class vector_pool {
public:
  std::vector<T> acquire() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) return {};
    std::vector<T> v = std::move(free_.back());
    free_.pop_back();
    return v;
  }
  void release(std::vector<T>&& v) noexcept {
    v.clear();
    std::lock_guard lock(mutex_);
    if (free_.size() < 2) {
      try {
        free_.push_back(std::move(v));
      } catch (...) {
      }
    }
  }

private:
  std::mutex mutex_;
  std::vector<std::vector<T>> free_;
};

template <class T>
struct pooled_vector {
  std::shared_ptr<vector_pool<T>> pool;
  std::vector<T> v;
  explicit pooled_vector(std::shared_ptr<vector_pool<T>> p) : pool(std::move(p)), v(pool->acquire()) {}
  pooled_vector(const pooled_vector&) = delete;
  pooled_vector& operator=(const pooled_vector&) = delete;
  ~pooled_vector() { pool->release(std::move(v)); }
};

// Asks for the features of x to be loaded into the cache where its type says how
// (prefetch_features), else does nothing.
template <class T>
void prefetch_element(const T& x) noexcept {
  if constexpr (requires { prefetch_features(x); }) prefetch_features(x);
}

// The picks shuffle_gen will make a few outputs from now, predicted by a copy of its random
// stream that runs ahead with the bounds the current phase will use, so that memory can be
// fetched early: the picks jump through the whole buffer and data set, and each would otherwise
// wait for memory twice (the buffered element, then the row it points to). A pick is predicted
// `far` outputs ahead, when its buffer slot is prefetched (slot(i)), and its element's data is
// prefetched `near` outputs ahead (data(i)). A wrong prediction (at the change from filling to
// draining, or a slot refilled before its turn) only prefetches something else; the order never
// changes.
class shuffle_lookahead {
public:
  static constexpr std::size_t near = 6;  // outputs ahead that a pick's data is prefetched
  static constexpr std::size_t far = 12;  // outputs ahead that a pick's buffer slot is prefetched

  // Restarts the prediction from `rng`'s state for a phase whose next draws have the bounds
  // bound, bound - shrink, bound - 2 * shrink, ...
  template <class Slot, class Data>
  void restart(const stream_rng& rng, std::size_t bound, std::size_t shrink, Slot&& slot, Data&& data) {
    ahead_ = rng;
    bound_ = bound;
    shrink_ = shrink;
    head_ = count_ = 0;
    for (std::size_t i = 0; i < far; ++i) draw(slot);
    for (std::size_t i = 0; i < near && i < count_; ++i) data(pending_[(head_ + i) % far]);
  }
  // One real draw was made: predicts the pick `far` draws after it and prefetches the data of the
  // one `near` draws after it.
  template <class Slot, class Data>
  void advance(Slot&& slot, Data&& data) {
    if (count_ == 0) return;
    head_ = (head_ + 1) % far;  // the pick just made
    --count_;
    if (count_ >= near) data(pending_[(head_ + near - 1) % far]);
    draw(slot);
  }

private:
  template <class Slot>
  void draw(Slot& slot) {
    if (bound_ == 0) return;
    const auto i = static_cast<std::size_t>(ahead_.below(bound_));
    bound_ -= shrink_;
    pending_[(head_ + count_) % far] = i;
    ++count_;
    slot(i);
  }

  stream_rng ahead_{0, 0};
  std::size_t bound_ = 0;
  std::size_t shrink_ = 0;
  std::array<std::size_t, far> pending_{};  // predicted picks, the next one at head_
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

template <class T>
generator<T> shuffle_gen(generator<T> up, std::size_t buffer_size, std::uint64_t seed, std::uint64_t epoch,
                         std::shared_ptr<vector_pool<T>> pool) {
  stream_rng rng(seed, epoch);
  pooled_vector<T> holder(std::move(pool));
  std::vector<T>& buf = holder.v;
  shuffle_lookahead ahead;
  const auto fetch_slot = [&buf](std::size_t i) {
    if (i < buf.size()) prefetch_row(&buf[i], sizeof(T));
  };
  const auto fetch_data = [&buf](std::size_t i) {
    if (i < buf.size()) prefetch_element(buf[i]);
  };
  for (auto&& x : up) {
    if (buf.size() < buffer_size) {
      buf.push_back(std::move(x));
      // Just filled: every draw from now on is below(buffer_size).
      if (buf.size() == buffer_size) ahead.restart(rng, buffer_size, 0, fetch_slot, fetch_data);
      continue;
    }
    // Buffer full: emit a uniformly chosen element and put the new one in its place.
    T& slot = buf[rng.below(buffer_size)];
    T out = std::move(slot);
    slot = std::move(x);
    ahead.advance(fetch_slot, fetch_data);
    co_yield std::move(out);
  }
  ahead.restart(rng, buf.size(), 1, fetch_slot, fetch_data);  // draining: the bound shrinks by one per draw
  while (!buf.empty()) {  // drain in random order
    T& slot = buf[rng.below(buf.size())];
    T out = std::move(slot);
    slot = std::move(buf.back());
    buf.pop_back();
    ahead.advance(fetch_slot, fetch_data);
    co_yield std::move(out);
  }
}

template <class S>
generator<pooled_batch> batch_gen(generator<S> up, std::size_t size, bool drop_remainder,
                                  std::shared_ptr<batch_pool> pool) {
  pooled_batch b;
  std::size_t rows = 0, width = 0, twidth = 0;
  bool labelled = false;
  for (auto&& s : up) {
    if (rows == 0) {
      b = pooled_batch(pool->acquire(), pool);
      width = feature_width(s);
      twidth = target_width(s);
      labelled = s.label != no_label;
      b.width = width;
      b.target_width = twidth;
      b.features.resize(size * width);
      b.targets.resize(size * twidth);
      b.labels.resize(labelled ? size : 0);
      b.indices.resize(size);
    } else if (feature_width(s) != width || target_width(s) != twidth) {
      throw shape_error("lockstep::data::batched: sample " + std::to_string(s.index) + " has " +
                        std::to_string(feature_width(s)) + " features and " + std::to_string(target_width(s)) +
                        " targets, the batch has " + std::to_string(width) + " and " + std::to_string(twidth));
    } else if ((s.label != no_label) != labelled) {
      throw data_error("lockstep::data::batched: sample " + std::to_string(s.index) +
                       (labelled ? " has no label in a labelled batch" : " has a label in an unlabelled batch"));
    }
    copy_features(s, b.features.data() + rows * width);
    if (twidth) copy_targets(s, b.targets.data() + rows * twidth);
    if (labelled) b.labels[rows] = s.label;
    b.indices[rows] = s.index;
    if (++rows == size) {
      rows = 0;
      co_yield pooled_batch(std::move(b));
    }
  }
  if (rows > 0 && !drop_remainder) {
    b.features.resize(rows * width);
    b.targets.resize(rows * twidth);
    b.labels.resize(labelled ? rows : 0);
    b.indices.resize(rows);
    co_yield pooled_batch(std::move(b));
  }
}

template <class T>
struct cache_state {
  dataset<T> upstream;
  std::mutex mutex;
  std::shared_ptr<const std::vector<T>> values;
  std::uint64_t filled = 0;  // the epoch of the pass that filled `values`
};

/// One pass of cache(): the epoch it gives and the one that filled the cache; for index batches,
/// the shard plan the pass's batches share.
struct cache_pass {
  std::uint64_t filled = 0, epoch = 0;
  std::shared_ptr<plan_slot> plan;
};

/// What cache() stores of, and gives for, element v in a pass: v itself, except for index-first
/// elements (below).
template <class T>
const T& cache_copy(const T& v, const cache_pass&) noexcept {
  return v;
}
/// A sample reference with its random image draws keyed for the pass's epoch (replay_epoch).
inline sample_ref cache_copy(sample_ref s, const cache_pass& p) noexcept {
  s.epoch = replay_epoch(s.epoch, p.filled, p.epoch);
  return s;
}
/// An index batch keyed for the pass's epoch, sharing no decoded rows with v (batch_for_pass).
inline index_batch cache_copy(const index_batch& v, const cache_pass& p) {
  return batch_for_pass(v, p.plan, p.filled, p.epoch);
}

template <class T>
generator<T> cache_gen(std::shared_ptr<cache_state<T>> state, std::uint64_t epoch) {
  std::shared_ptr<const std::vector<T>> values;
  cache_pass pass{epoch, epoch, nullptr};
  {
    std::lock_guard lock(state->mutex);
    values = state->values;
    if (values) pass.filled = state->filled;
  }
  if (values) {
    if constexpr (std::is_same_v<T, index_batch>) pass.plan = std::make_shared<plan_slot>();
    for (const T& v : *values) co_yield cache_copy(v, pass);
    co_return;
  }
  // The filling pass gives the upstream's elements, one behind: the cache is filled when the
  // upstream ends, before the last element is given (a consumer that stops at the last element,
  // `take(size)`, does not resume this pass past it). The copies it stores get no shard plan
  // (each replay gives its own).
  auto fill = std::make_shared<std::vector<T>>();
  std::optional<T> held;
  std::exception_ptr failed;  // the upstream's error: raised after the element held back
  try {
    for (auto&& x : state->upstream.epoch(epoch)) {
      fill->push_back(cache_copy(x, pass));
      if (held) co_yield std::move(*held);
      held.emplace(std::move(x));
    }
  } catch (...) {
    failed = std::current_exception();
  }
  if (failed) {
    if (held) co_yield std::move(*held);
    std::rethrow_exception(failed);
  }
  {
    std::lock_guard lock(state->mutex);  // only a pass that ran to the end fills the cache
    if (!state->values) {
      state->values = std::move(fill);
      state->filled = epoch;
    }
  }
  if (held) co_yield std::move(*held);
}

}  // namespace detail

/// Stage: applies f to every element (f may return another type). @tparam F callable T -> U.
template <class F>
struct map_closure : closure<map_closure<F>> {
  F f;  ///< the transform
  /// Applies the stage to a dataset.
  template <class T>
    requires std::invocable<const F&, T&&>
  auto operator()(dataset<T> d) const {
    using R = std::remove_cvref_t<std::invoke_result_t<const F&, T&&>>;
    return dataset<R>{[d = std::move(d), f = f](std::uint64_t e) { return detail::map_gen<T, R, F>(d.epoch(e), f); }};
  }
};
/// Transforms every element with f (e.g. `map(scale(1.0f / 255))`).
template <class F>
map_closure<std::decay_t<F>> map(F&& f) {
  return {{}, std::forward<F>(f)};
}

/// Stage: keeps the elements for which the predicate is true.
template <class P>
struct filter_closure : closure<filter_closure<P>> {
  P pred;  ///< the predicate
  /// Applies the stage to a dataset.
  template <class T>
    requires std::predicate<const P&, const T&>
  dataset<T> operator()(dataset<T> d) const {
    return dataset<T>{[d = std::move(d), p = pred](std::uint64_t e) { return detail::filter_gen<T, P>(d.epoch(e), p); }};
  }
};
/// Keeps the elements x with pred(x) true.
template <class P>
filter_closure<std::decay_t<P>> filter(P&& pred) {
  return {{}, std::forward<P>(pred)};
}

/// Stage: tf.data shuffle with a bounded buffer (see shuffle()).
struct shuffle_closure : closure<shuffle_closure> {
  std::size_t buffer_size = 1;  ///< elements held in the buffer
  std::uint64_t seed = 0;       ///< the seed; the epoch is mixed in
  /// Applies the stage to a dataset.
  template <class T>
  dataset<T> operator()(dataset<T> d) const {
    auto pool = std::make_shared<detail::vector_pool<T>>();
    return dataset<T>{[d = std::move(d), n = buffer_size, s = seed, pool](std::uint64_t e) {
      return detail::shuffle_gen<T>(d.epoch(e), n, s, e, pool);
    }};
  }
};
/// Shuffles with a buffer of `buffer_size` elements (tf.data semantics): the buffer is filled with
/// the first elements; each output is a uniformly chosen buffer element, replaced by the next
/// input; at the end the buffer drains in random order. buffer_size 1 is the identity; a buffer at
/// least as large as the dataset gives a uniform permutation; in general the element at input
/// position i comes out at position >= i - (buffer_size - 1). The order depends only on
/// (seed, epoch). Elements with a `prefetch_features(const T&)` (found by argument-dependent
/// lookup; `sample` has one) have their data prefetched a few picks ahead, since the picks jump
/// through the whole data set. @throws config_error when buffer_size is 0.
inline shuffle_closure shuffle(std::size_t buffer_size, std::uint64_t seed) {
  if (buffer_size == 0) throw config_error("lockstep::data::shuffle: buffer_size must be >= 1");
  return {{}, buffer_size, seed};
}

/// Stage: groups consecutive samples into a `batch` (see batched()).
struct batch_closure : closure<batch_closure> {
  std::size_t size = 1;         ///< rows per batch
  bool drop_remainder = false;  ///< drop a last, smaller batch
  /// Applies the stage to a dataset of batchable samples.
  template <batchable S>
  dataset<pooled_batch> operator()(dataset<S> d) const {
    auto pool = std::make_shared<batch_pool>();
    return dataset<pooled_batch>{[d = std::move(d), n = size, drop = drop_remainder, pool](std::uint64_t e) {
      return detail::batch_gen<S>(d.epoch(e), n, drop, pool);
    }};
  }
  /// Applies the stage to an index-first dataset: each batch holds the samples' indices only
  /// (index_batch); its rows are loaded when it is cut into shards.
  dataset<index_batch> operator()(dataset<sample_ref> d) const {
    auto stage = std::make_shared<detail::index_stage>();
    return dataset<index_batch>{[d = std::move(d), n = size, drop = drop_remainder, stage](std::uint64_t e) {
      return detail::index_batch_gen(d.epoch(e), n, drop, stage);
    }};
  }
};
/// Groups `size` consecutive samples into one `batch` (yielded as `pooled_batch`, a batch whose
/// buffers are recycled when it is destroyed); index-first samples (sample_ref) into an
/// `index_batch`, loaded when cut into shards. The last batch is smaller unless drop_remainder.
/// `indices` holds each row's dataset index. @throws config_error when size is 0.
/// (Named `batched`, not `batch`: a function `batch` would hide the type `lockstep::data::batch`.)
inline batch_closure batched(std::size_t size, bool drop_remainder = false) {
  if (size == 0) throw config_error("lockstep::data::batched: size must be >= 1");
  return {{}, size, drop_remainder};
}

/// Stage: concatenates several epochs of the upstream (see repeat()).
struct repeat_closure : closure<repeat_closure> {
  std::optional<std::uint64_t> times;  ///< repetitions, or forever
  /// Applies the stage to a dataset.
  template <class T>
  dataset<T> operator()(dataset<T> d) const {
    return dataset<T>{[d = std::move(d), k = times](std::uint64_t e) { return detail::repeat_gen<T>(d, k, e); }};
  }
};
/// Repeats the upstream `times` times: epoch e of the result is upstream epochs e*times ..
/// e*times + times-1 in a row (so a shuffle before repeat reshuffles every repetition).
/// @throws config_error (when epoch e starts) if e*times + times-1 passes 2^64 - 1.
inline repeat_closure repeat(std::uint64_t times) { return {{}, times}; }
/// Repeats forever: epoch e is upstream epochs (e << 32) + 0, 1, 2, ... (stops if one is empty).
inline repeat_closure repeat() { return {{}, std::nullopt}; }

/// Stage: the first n elements.
struct take_closure : closure<take_closure> {
  std::uint64_t count = 0;  ///< elements kept
  /// Applies the stage to a dataset.
  template <class T>
  dataset<T> operator()(dataset<T> d) const {
    return dataset<T>{[d = std::move(d), n = count](std::uint64_t e) { return detail::take_gen<T>(d.epoch(e), n); }};
  }
};
/// Keeps the first n elements (and pulls no more than n from upstream).
inline take_closure take(std::uint64_t n) { return {{}, n}; }

/// Stage: all but the first n elements.
struct skip_closure : closure<skip_closure> {
  std::uint64_t count = 0;  ///< elements dropped
  /// Applies the stage to a dataset.
  template <class T>
  dataset<T> operator()(dataset<T> d) const {
    return dataset<T>{[d = std::move(d), n = count](std::uint64_t e) { return detail::skip_gen<T>(d.epoch(e), n); }};
  }
};
/// Drops the first n elements.
inline skip_closure skip(std::uint64_t n) { return {{}, n}; }

/// Stage: remembers the first complete pass and replays it (see cache()).
struct cache_closure : closure<cache_closure> {
  /// Applies the stage to a dataset.
  template <std::copy_constructible T>
  dataset<T> operator()(dataset<T> d) const {
    auto state = std::make_shared<detail::cache_state<T>>();
    state->upstream = std::move(d);
    return dataset<T>{[state](std::uint64_t e) { return detail::cache_gen<T>(state, e); }};
  }
};
/// Caches the elements of the first pass that runs to its end; later epochs replay them in the
/// same order (put shuffle after cache to reshuffle each epoch). A pass abandoned early caches
/// nothing. Copies of one dataset share the cache. Index-first elements (sample_ref, index_batch)
/// are references, decoded at the cut: cache() keeps no decoded rows, and the random image stages,
/// before or after it, draw anew in each epoch, as they would without cache()
/// (detail::replay_epoch).
inline cache_closure cache() { return {}; }

}  // namespace lockstep::data
