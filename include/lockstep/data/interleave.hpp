#pragma once
/// @file interleave.hpp
/// `interleave(cycle, block)`: reads a grouped dataset (the samples of an index-first source come
/// in groups — a tar shard, a folder — see sample_source::group) a few groups at a time, the way
/// tf.data's interleave reads a few files at a time: on slow storage each open group is read
/// sequentially, instead of jumping anywhere as a global shuffle does. Follow it by a bounded
/// `shuffle(buffer, seed)` to mix the samples of the open groups.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/detail/random.hpp>
#include <lockstep/data/generator.hpp>

namespace lockstep::data {

/// An element that belongs to a group (sample_ref does); a run of consecutive elements with the
/// same group is one group.
template <class T>
concept grouped = requires(const T& t) {
  { t.group } -> std::convertible_to<std::uint32_t>;
};

namespace detail {

template <class T>
generator<T> interleave_gen(generator<T> up, std::size_t cycle, std::size_t block, std::optional<std::uint64_t> seed,
                            std::uint64_t epoch) {
  // The groups of the epoch, in upstream order (consecutive runs of one group id).
  std::vector<T> items;
  std::vector<std::size_t> starts;
  for (auto&& x : up) {
    if (items.empty() || static_cast<std::uint32_t>(x.group) != static_cast<std::uint32_t>(items.back().group))
      starts.push_back(items.size());
    items.push_back(std::move(x));
  }
  starts.push_back(items.size());
  const std::size_t groups = starts.size() - 1;
  std::vector<std::size_t> order(groups);
  for (std::size_t g = 0; g < groups; ++g) order[g] = g;
  if (seed && groups > 1) {  // Fisher-Yates from (seed, epoch)
    stream_rng rng(*seed ^ 0x696e7465726c6561ull, epoch);
    for (std::size_t i = groups - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  }
  // Slots read their group from `pos` to `end`; an exhausted slot takes the next group at once.
  struct slot {
    std::size_t pos = 0, end = 0;
  };
  std::vector<slot> slots(std::min(cycle, groups));
  std::size_t next = 0;
  for (auto& s : slots) {
    s = {starts[order[next]], starts[order[next] + 1]};
    ++next;
  }
  std::size_t active = slots.size();
  for (std::size_t i = 0; active > 0; i = (i + 1) % slots.size()) {
    slot& s = slots[i];
    if (s.pos == s.end) continue;
    for (std::size_t k = 0; k < block && s.pos < s.end; ++k) {
      const std::size_t at = s.pos;
      ++s.pos;
      co_yield std::move(items[at]);
    }
    if (s.pos == s.end) {
      if (next < groups) {
        s = {starts[order[next]], starts[order[next] + 1]};
        ++next;
      } else {
        --active;
      }
    }
  }
}

}  // namespace detail

/// Stage: cycles over groups (see interleave()).
struct interleave_closure : closure<interleave_closure> {
  std::size_t cycle = 1;               ///< groups open at once
  std::size_t block = 1;               ///< consecutive elements taken from a group per turn
  std::optional<std::uint64_t> seed;   ///< shuffles the group order per epoch when set
  /// Applies the stage to a dataset of grouped elements.
  template <grouped T>
  dataset<T> operator()(dataset<T> d) const {
    return dataset<T>{[d = std::move(d), c = cycle, b = block, s = seed](std::uint64_t e) {
      return detail::interleave_gen<T>(d.epoch(e), c, b, s, e);
    }};
  }
};

/// Reads `cycle` groups at once, `block` consecutive elements from each in turn (the groups in
/// upstream order, each group read front to back). When a group is exhausted its slot takes the
/// next group at once; the order ends when every group is read. Every element is passed on once.
/// The sequence is a pure function of the upstream (for index-first sources: the sorted file list)
/// and the epoch, independent of the number of workers and replicas. The stage holds one epoch's
/// elements (index-first references: 40 bytes each).
/// @throws config_error when cycle or block is 0.
inline interleave_closure interleave(std::size_t cycle, std::size_t block) {
  if (cycle == 0 || block == 0) throw config_error("lockstep::data::interleave: cycle and block must be >= 1");
  return {{}, cycle, block, std::nullopt};
}

/// As interleave(cycle, block), with the order of the groups shuffled by (seed, epoch) first (as
/// tf.data's list_files(shuffle=True) before interleave).
inline interleave_closure interleave(std::size_t cycle, std::size_t block, std::uint64_t seed) {
  auto c = interleave(cycle, block);
  c.seed = seed;
  return c;
}

}  // namespace lockstep::data
