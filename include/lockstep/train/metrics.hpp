#pragma once
/// @file metrics.hpp
/// Exact classification metrics. Every metric is kept as a SUM and a COUNT (loss sum, correct
/// predictions, samples); replicas reduce the sums and the counts, and only the final ratio is a
/// division, so a metric over N replicas equals the metric over one device, whatever the shard sizes.

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

/// Adds the top-1 and top-k counts of `rows` host output rows (rows x cols) against `labels` to `m`
/// (a null `labels` adds nothing). Does not touch loss_sum or count. A label outside [0, cols) is
/// a miss, as in training's accuracy: the loss's own rule (label_classes) has checked the labels,
/// and a loss without one (mse on rows that also carry a class label) or with more classes than
/// outputs may take them.
template <class T>
void count_predictions(const T* out, std::size_t rows, std::size_t cols, const std::int32_t* labels, std::size_t k,
                       metric_sums& m) {
  if (!labels) return;
  for (std::size_t i = 0; i < rows; ++i) {
    ++m.labelled;
    if (labels[i] < 0 || static_cast<std::size_t>(labels[i]) >= cols) continue;
    const std::size_t r = rank_of(out + i * cols, cols, static_cast<std::size_t>(labels[i]));
    m.correct += r == 0 ? 1 : 0;
    m.top_k_correct += r < k ? 1 : 0;
  }
}

}  // namespace lockstep
