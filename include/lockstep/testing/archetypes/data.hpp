#pragma once
/// @file data.hpp (testing/archetypes)
/// The archetypes of the pipeline element and the batch source: exactly what `batched`
/// assembles and what fit and evaluate read (see model.hpp for why they live outside lockstep).
/// tests/train/source_strategy_archetypes_test.cpp runs them through the stages into fit.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include <lockstep/data/batch.hpp>

namespace lockstep_archetypes {

namespace ls = lockstep;

/// Pipeline element: exactly what `batched` assembles (feature_width, target_width,
/// copy_features, copy_targets, found by argument-dependent lookup, and `label`, `index`), and
/// move-only, so no stage may copy it.
struct row {
  std::vector<float> x;
  std::int32_t label = 0;
  std::uint64_t index = 0;
  row(std::vector<float> v, std::int32_t l, std::uint64_t i) : x(std::move(v)), label(l), index(i) {}
  row(row&&) = default;
  row& operator=(row&&) = default;
  row(const row&) = delete;
  row& operator=(const row&) = delete;
};
/// The features per row.
inline std::size_t feature_width(const row& r) { return r.x.size(); }
/// No regression targets.
inline std::size_t target_width(const row&) { return 0; }
/// Copies the features into a batch.
inline void copy_features(const row& r, float* dst) { std::copy(r.x.begin(), r.x.end(), dst); }
/// Nothing to copy.
inline void copy_targets(const row&, float*) {}

/// Batch source for fit and evaluate: `epoch(e) const` returning an input range of
/// `lockstep::data::batch` (here a hand-written one over fixed batches), and copyable.
struct batch_list {
  struct iterator {
    using iterator_concept = std::input_iterator_tag;
    using value_type = ls::data::batch;
    using difference_type = std::ptrdiff_t;
    const ls::data::batch* at = nullptr;
    const ls::data::batch* last = nullptr;
    const ls::data::batch& operator*() const { return *at; }
    iterator& operator++() {
      ++at;
      return *this;
    }
    void operator++(int) { ++at; }
    bool operator==(std::default_sentinel_t) const { return at == last; }
  };
  struct range {
    std::shared_ptr<const std::vector<ls::data::batch>> all;
    iterator begin() const { return {all->data(), all->data() + all->size()}; }
    std::default_sentinel_t end() const { return {}; }
  };
  std::shared_ptr<const std::vector<ls::data::batch>> all;
  range epoch(std::uint64_t) const { return {all}; }
};

}  // namespace lockstep_archetypes
