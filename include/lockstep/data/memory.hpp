#pragma once
/// @file memory.hpp
/// In-memory sources: a decoded table of rows (uint8 or float features, optional labels or
/// regression targets) shared by every epoch and every sample view.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/data/sample.hpp>

namespace lockstep::data {

/// A decoded dataset held in memory: `rows` rows of `width` features stored contiguously either as
/// uint8 (`bytes`, starting at `byte_offset`) or as float (`values`), plus optional labels and
/// targets. Sources build one table; every sample is a view into it.
struct table {
  std::vector<std::uint8_t> bytes;   ///< uint8 storage (e.g. a whole decoded IDX file)
  std::size_t byte_offset = 0;       ///< where row 0 starts in bytes
  std::vector<float> values;         ///< float storage, rows * width (when bytes is empty)
  std::vector<std::int32_t> labels;  ///< one label per row, or empty
  std::vector<float> targets;        ///< rows * target_width, or empty
  std::size_t rows = 0;              ///< number of samples
  std::size_t width = 0;             ///< features per row
  std::size_t target_width = 0;      ///< targets per row

  /// The view of row i.
  [[nodiscard]] sample row(std::size_t i) const noexcept {
    sample s;
    if (!bytes.empty()) {
      s.pixels = bytes.data() + byte_offset + i * width;
    } else {
      s.values = values.data() + i * width;
    }
    s.width = static_cast<std::uint32_t>(width);
    if (target_width) {
      s.targets = targets.data() + i * target_width;
      s.target_width = static_cast<std::uint32_t>(target_width);
    }
    s.label = labels.empty() ? no_label : labels[i];
    s.index = i;
    return s;
  }
};

namespace detail {
inline generator<sample> table_source(std::shared_ptr<const table> t) {
  for (std::size_t i = 0; i < t->rows; ++i) co_yield t->row(i);
}

inline void check_table(const table& t, const std::string& who) {
  auto fail = [&](const std::string& what) { throw data_error("lockstep::data::" + who + ": " + what); };
  if (t.width > 0xffffffffu || t.target_width > 0xffffffffu) fail("row width does not fit 32 bits");
  const std::size_t stored = t.bytes.empty() ? t.values.size() : t.bytes.size() - t.byte_offset;
  if (t.width == 0 ? stored != 0 : stored % t.width != 0)
    fail(std::to_string(stored) + " feature values are not a whole number of rows of width " + std::to_string(t.width));
  if (t.width != 0 && stored / t.width != t.rows)
    fail(std::to_string(stored / t.width) + " feature rows, expected " + std::to_string(t.rows));
  if (!t.labels.empty() && t.labels.size() != t.rows)
    fail(std::to_string(t.labels.size()) + " labels for " + std::to_string(t.rows) + " rows");
  for (std::size_t i = 0; i < t.labels.size(); ++i)
    if (t.labels[i] < 0) fail("label " + std::to_string(t.labels[i]) + " of row " + std::to_string(i) + " is negative");
  if (t.targets.size() != t.rows * t.target_width)
    fail(std::to_string(t.targets.size()) + " target values, expected " + std::to_string(t.rows * t.target_width));
}
}  // namespace detail

/// A dataset of views over a shared table (validated: sizes agree, labels >= 0).
/// @throws data_error when the table is inconsistent.
inline dataset<sample> from_table(std::shared_ptr<const table> t) {
  detail::check_table(*t, "from_table");
  return dataset<sample>{[t = std::move(t)](std::uint64_t) { return detail::table_source(t); }};
}

/// Float features (rows of `width`, row-major) with optional class labels (one per row, >= 0).
/// @throws data_error when the sizes disagree.
inline dataset<sample> from_memory(std::vector<float> features, std::size_t width,
                                   std::vector<std::int32_t> labels = {}) {
  auto t = std::make_shared<table>();
  t->rows = width ? features.size() / width : labels.size();
  t->values = std::move(features);
  t->width = width;
  t->labels = std::move(labels);
  return from_table(std::move(t));
}

/// uint8 features (e.g. pixels; rows of `width`) with optional class labels.
/// @throws data_error when the sizes disagree.
inline dataset<sample> from_memory(std::vector<std::uint8_t> features, std::size_t width,
                                   std::vector<std::int32_t> labels = {}) {
  auto t = std::make_shared<table>();
  t->rows = width ? features.size() / width : labels.size();
  t->bytes = std::move(features);
  t->width = width;
  t->labels = std::move(labels);
  return from_table(std::move(t));
}

/// Regression data: float features and float targets (`target_width` per row).
/// @throws data_error when the sizes disagree.
inline dataset<sample> from_memory(std::vector<float> features, std::size_t width, std::vector<float> targets,
                                   std::size_t target_width) {
  auto t = std::make_shared<table>();
  t->rows = width ? features.size() / width : (target_width ? targets.size() / target_width : 0);
  t->values = std::move(features);
  t->width = width;
  t->targets = std::move(targets);
  t->target_width = target_width;
  return from_table(std::move(t));
}

/// An unlabelled float tensor of rows (shape rows x width, row-major), e.g. for inference.
/// @throws data_error when the size is not a whole number of rows.
inline dataset<sample> from_rows(std::vector<float> rows, std::size_t width) {
  return from_memory(std::move(rows), width, std::vector<std::int32_t>{});
}

}  // namespace lockstep::data
