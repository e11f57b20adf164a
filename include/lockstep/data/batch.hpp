#pragma once
/// @file batch.hpp
/// The contract between the input pipeline and the strategy: a global batch, its shards, and a
/// distributed batch (one shard per replica).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>

namespace lockstep::data {

/// A global batch as one pipeline produces it: row-major features, optional labels or targets, and
/// the dataset index of every row.
///
/// A batch normally holds the values of every row. A batch cut from an index-first pipeline
/// (indexed.hpp) holds only the rows this process trains on: `features`, `labels` and `targets`
/// then start at global row `first_held` and hold `held_rows` rows, while `indices` still lists
/// every row of the global batch.
struct batch {
  /// The value of `held_rows` for a batch that holds every row.
  static constexpr std::size_t every_row = std::numeric_limits<std::size_t>::max();

  std::vector<float> features;        ///< rows() * width values, row-major (see first_held)
  std::vector<std::int32_t> labels;   ///< one class label per row (empty for unlabelled data)
  std::vector<float> targets;         ///< rows() * target_width regression targets (may be empty)
  std::vector<std::uint64_t> indices; ///< dataset index of each row (exactly-once bookkeeping)
  std::size_t width = 0;              ///< features per row
  std::size_t target_width = 0;       ///< targets per row (0 when there are none)
  std::size_t first_held = 0;         ///< the global row that features, labels and targets start at
  std::size_t held_rows = every_row;  ///< rows whose values the batch holds (every_row: all of them)

  /// Number of rows (samples) in the batch.
  [[nodiscard]] std::size_t rows() const noexcept { return indices.size(); }
  /// True when the batch holds the values of every row (always, except for the batches an
  /// index-first pipeline cuts for one process).
  [[nodiscard]] bool holds_every_row() const noexcept {
    return held_rows == every_row || (first_held == 0 && held_rows >= rows());
  }
};

/// One replica's contiguous part of a global batch: non-owning views plus where the rows sit.
/// An empty shard (size == 0) is valid: its replica still takes part in every collective.
struct shard {
  const float* features = nullptr;        ///< size * width values
  const std::int32_t* labels = nullptr;   ///< size labels, or nullptr when unlabelled
  const float* targets = nullptr;         ///< size * target_width values, or nullptr
  const std::uint64_t* indices = nullptr; ///< size dataset indices
  std::size_t size = 0;                   ///< rows in this shard
  std::size_t width = 0;                  ///< features per row
  std::size_t target_width = 0;           ///< targets per row
  std::size_t offset = 0;                 ///< position of the first row in the global batch
  std::size_t global_size = 0;            ///< rows in the whole global batch

  /// The dataset indices of this shard's rows.
  [[nodiscard]] std::span<const std::uint64_t> index_span() const noexcept { return {indices, size}; }
};

/// A global batch cut into one shard per replica (sizes differ by at most one), sharing ownership
/// of the batch so the shards stay valid while any replica uses them.
struct distributed_batch {
  std::shared_ptr<const batch> global;  ///< the whole batch the shards point into
  std::vector<shard> shards;            ///< shard r goes to replica r

  /// Rows in the global batch.
  [[nodiscard]] std::size_t global_size() const noexcept { return global ? global->rows() : 0; }
};

namespace detail {
/// Refuses a batch that does not hold every row, naming `what` needs them.
inline void require_every_row(const batch& b, const char* what) {
  if (!b.holds_every_row())
    throw config_error(std::string("lockstep::data::") + what + ": the global batch holds the values of rows " +
                       std::to_string(b.first_held) + ".." + std::to_string(b.first_held + b.held_rows) + " of its " +
                       std::to_string(b.rows()) +
                       " rows only (an index-first pipeline decodes only the rows of this process's shards); "
                       "a step that reads every row of the global batch cannot run on it");
}

/// Refuses (shape_error, naming `what` reads them) a batch whose features, labels or targets do
/// not hold exactly its rows: every row is read through `indices`, so rows would be dropped (a
/// batch filled by hand without indices) or read past the end.
inline void require_consistent(const batch& b, const char* what) {
  const std::size_t rows = b.rows();
  const auto mismatch = [&](const char* field, std::size_t have, std::size_t want, const char* per_row) {
    throw shape_error(std::string("lockstep::data::") + what + ": the batch has " + std::to_string(rows) +
                      " rows (its indices) but `" + field + "` holds " + std::to_string(have) + " values, not " +
                      std::to_string(want) + " (" + per_row + "); fill `indices` with one dataset index per row");
  };
  if (b.features.size() != rows * b.width) mismatch("features", b.features.size(), rows * b.width, "rows x width");
  if (!b.labels.empty() && b.labels.size() != rows) mismatch("labels", b.labels.size(), rows, "one per row");
  if (!b.targets.empty() && b.targets.size() != rows * b.target_width)
    mismatch("targets", b.targets.size(), rows * b.target_width, "rows x target_width");
}
}  // namespace detail

/// Rows [first, first + count) of batch `b` (first + count <= b.rows()) as a shard; `b` holds
/// every row (see batch::holds_every_row).
inline shard rows_of(const batch& b, std::size_t first, std::size_t count) noexcept {
  shard s;
  s.features = b.features.data() + first * b.width;
  s.labels = b.labels.empty() ? nullptr : b.labels.data() + first;
  s.targets = b.targets.empty() ? nullptr : b.targets.data() + first * b.target_width;
  s.indices = b.indices.data() + first;
  s.size = count;
  s.width = b.width;
  s.target_width = b.target_width;
  s.offset = first;
  s.global_size = b.rows();
  return s;
}

/// Cuts a global batch into n contiguous shards whose sizes differ by at most one (the first
/// `rows % n` shards get one extra row).
/// @throws config_error when n is 0 or the batch does not hold every row (see batch::first_held),
/// and shape_error when its features, labels or targets do not hold exactly rows() rows.
inline std::vector<shard> split(const batch& b, std::size_t n) {
  if (n == 0) throw config_error("lockstep::data::split: a batch of " + std::to_string(b.rows()) + " rows into 0 shards");
  detail::require_every_row(b, "split");
  detail::require_consistent(b, "split");
  std::vector<shard> out(n);
  const std::size_t rows = b.rows(), base = rows / n, extra = rows % n;
  std::size_t offset = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t size = base + (r < extra ? 1 : 0);
    out[r] = rows_of(b, offset, size);
    offset += size;
  }
  return out;
}

/// The whole batch as a single shard (what one-device training consumes).
/// @throws config_error when the batch does not hold every row (see batch::first_held), and
/// shape_error when its features, labels or targets do not hold exactly rows() rows.
inline shard whole(const batch& b) {
  detail::require_every_row(b, "whole");
  detail::require_consistent(b, "whole");
  return rows_of(b, 0, b.rows());
}

/// Rows [first, first + count) of shard `s` (first + count <= s.size) as a shard of their own:
/// the same batch, `first` rows further into it.
inline shard rows_of(const shard& s, std::size_t first, std::size_t count) noexcept {
  shard r = s;
  r.features = s.features ? s.features + first * s.width : nullptr;
  r.labels = s.labels ? s.labels + first : nullptr;
  r.targets = s.targets ? s.targets + first * s.target_width : nullptr;
  r.indices = s.indices ? s.indices + first : nullptr;
  r.size = count;
  r.offset = s.offset + first;
  return r;
}

}  // namespace lockstep::data
