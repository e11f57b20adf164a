#pragma once
/// @file metrics.hpp
/// Exact classification metrics. Every metric is kept as a SUM and a COUNT (loss sum, correct
/// predictions, samples); replicas reduce the sums and the counts, and only the final ratio is a
/// division, so a metric over N replicas equals the metric over one device, whatever the shard sizes.

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/losses/loss.hpp>

namespace lockstep {

/// Sums and counts from which loss, accuracy and top-k accuracy are computed.
struct metric_sums {
  double loss_sum = 0;             ///< sum of per-sample losses
  std::uint64_t count = 0;         ///< samples seen
  std::uint64_t labelled = 0;      ///< samples that carried a class label
  std::uint64_t correct = 0;       ///< labelled samples whose top-1 prediction is the label
  std::uint64_t top_k_correct = 0; ///< labelled samples whose label is among the k highest outputs

  /// Adds another set of sums.
  metric_sums& operator+=(const metric_sums& o) noexcept {
    loss_sum += o.loss_sum;
    count += o.count;
    labelled += o.labelled;
    correct += o.correct;
    top_k_correct += o.top_k_correct;
    return *this;
  }
  /// Mean loss per sample (NaN when empty).
  [[nodiscard]] double loss() const noexcept {
    return count ? loss_sum / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
  }
  /// Top-1 accuracy over the labelled samples (NaN when there are none).
  [[nodiscard]] double accuracy() const noexcept {
    return labelled ? static_cast<double>(correct) / static_cast<double>(labelled)
                    : std::numeric_limits<double>::quiet_NaN();
  }
  /// Top-k accuracy over the labelled samples (NaN when there are none).
  [[nodiscard]] double top_k_accuracy() const noexcept {
    return labelled ? static_cast<double>(top_k_correct) / static_cast<double>(labelled)
                    : std::numeric_limits<double>::quiet_NaN();
  }
};

/// How many outputs of `row` rank ahead of output `label`: those strictly larger, and those equal
/// with a smaller index (so ties resolve to the lowest index, as an argmax does). The prediction
/// is top-k correct when the result is < k.
template <class T>
[[nodiscard]] std::size_t rank_of(const T* row, std::size_t cols, std::size_t label) noexcept {
  const T v = row[label];
  std::size_t ahead = 0;
  for (std::size_t j = 0; j < cols; ++j) ahead += (row[j] > v || (row[j] == v && j < label)) ? 1 : 0;
  return ahead;
}

/// Adds the top-1 and top-k counts of `rows` host output rows (rows x cols) against `labels` to `m`
/// (a null `labels` adds nothing). Does not touch loss_sum or count.
/// @throws shape_error when a label is negative or not below cols.
template <class T>
void count_predictions(const T* out, std::size_t rows, std::size_t cols, const std::int32_t* labels, std::size_t k,
                       metric_sums& m) {
  if (!labels) return;
  for (std::size_t i = 0; i < rows; ++i) {
    if (labels[i] < 0 || static_cast<std::size_t>(labels[i]) >= cols)
      throw shape_error("lockstep::metrics: label " + std::to_string(labels[i]) + " of row " + std::to_string(i) +
                        " is outside the model's " + std::to_string(cols) + " outputs");
    const std::size_t r = rank_of(out + i * cols, cols, static_cast<std::size_t>(labels[i]));
    m.correct += r == 0 ? 1 : 0;
    m.top_k_correct += r < k ? 1 : 0;
    ++m.labelled;
  }
}

namespace detail {

/// Counters a counting_loss adds to from every replica thread.
struct accuracy_counters {
  std::atomic<std::uint64_t> correct{0};   ///< top-1 hits
  std::atomic<std::uint64_t> labelled{0};  ///< labelled rows seen
  std::atomic<bool> unavailable{false};    ///< a replica's outputs were not on the host
};

/// Wraps a loss so that each evaluation during training also counts top-1 hits of the
/// training-mode outputs: from loss_sum::correct when the loss counts them (on any device),
/// otherwise by reading host outputs (on other devices the accuracy is then unavailable).
template <class Loss>
struct counting_loss {
  using loss_concept = loss_tag;                                    ///< opts in to the loss concept
  static constexpr std::size_t scratch_per_row = Loss::scratch_per_row;  ///< as the wrapped loss
  static constexpr std::string_view name = loss_name<Loss>();       ///< the wrapped loss's, for messages
  /// The wrapped loss's label classes (so a replica checks labels as for the wrapped loss).
  static constexpr std::size_t label_classes(std::size_t outputs) noexcept
    requires takes_class_labels<Loss>
  {
    return Loss::label_classes(outputs);
  }
  const Loss* inner;                                                ///< the loss being trained
  accuracy_counters* counters;                                      ///< where hits are added

  /// Counts the hits of `a.out`, then evaluates the wrapped loss.
  template <class T, class Ctx, class Shape>
  loss_sum evaluate(Ctx& ctx, const loss_args<T, Ctx, Shape>& a) const {
    constexpr std::size_t cols = Shape::size;
    const std::size_t rows = a.rows();
    const targets<T>& t = a.target;
    if constexpr (counts_correct_v<Loss>) {
      const loss_sum l = inner->evaluate(ctx, a);
      if (t.labels && rows > 0) {
        counters->correct.fetch_add(l.correct, std::memory_order_relaxed);
        counters->labelled.fetch_add(rows, std::memory_order_relaxed);
      }
      return l;
    } else {
      if (t.labels && rows > 0) {
        if constexpr (std::is_same_v<std::remove_cv_t<Ctx>, backend::host_context>) {
          std::uint64_t hits = 0;
          for (std::size_t i = 0; i < rows; ++i)
            if (t.labels[i] >= 0 && static_cast<std::size_t>(t.labels[i]) < cols)
              hits += rank_of(a.out.row(i), cols, static_cast<std::size_t>(t.labels[i])) == 0 ? 1 : 0;
          counters->correct.fetch_add(hits, std::memory_order_relaxed);
          counters->labelled.fetch_add(rows, std::memory_order_relaxed);
        } else {
          counters->unavailable.store(true, std::memory_order_relaxed);
        }
      }
      return inner->evaluate(ctx, a);
    }
  }
};

}  // namespace detail
}  // namespace lockstep
