#pragma once
/// @file labels.hpp
/// `check_labels`: the one check of class labels against the model's outputs, made on the host
/// before a shard is staged or evaluated on any device, with the one message every device gives:
///
///     lockstep::softmax_cross_entropy: label 9 of sample 41 (row 3 of replica 0's shard at step 0)
///     is outside [0, 5): the model has 5 outputs
///
/// (one line). A loss whose labels index the model's output row says so with
/// `static constexpr std::size_t label_classes(std::size_t outputs)` (see losses/loss.hpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <lockstep/core/error.hpp>

namespace lockstep {

/// Where the labels check_labels looks at come from; every part is optional and named in the
/// message when known.
struct label_site {
  /// The value of `replica` and `step` when they are not known.
  static constexpr std::uint64_t unknown = ~std::uint64_t{0};
  const std::uint64_t* indices = nullptr;  ///< the dataset index of each row (the batch's indices), or null
  std::uint64_t replica = unknown;         ///< the replica whose shard the rows are
  std::uint64_t step = unknown;            ///< the training step (the model's update count)
};

/// Throws data_error naming the first of `rows` labels outside [0, classes): its value, its
/// sample's dataset index, its row, the replica and step (those `site` knows), the bound and the
/// model's `outputs`. One pass over the labels; allocates nothing unless a label is bad. `who`
/// names the loss (`lockstep::softmax_cross_entropy`).
inline void check_labels(std::string_view who, const std::int32_t* labels, std::size_t rows, std::size_t classes,
                         std::size_t outputs, const label_site& site = {}) {
  if (!labels || rows == 0) return;
  // A branch-free pass first (the common case: every label is good), then the search for the
  // first bad one.
  bool bad = false;
  for (std::size_t i = 0; i < rows; ++i)
    bad |= static_cast<std::uint64_t>(static_cast<std::int64_t>(labels[i])) >= classes;
  if (!bad) return;
  std::size_t row = 0;
  while (labels[row] >= 0 && static_cast<std::uint64_t>(labels[row]) < classes) ++row;
  std::string m(who);
  m += ": label " + std::to_string(labels[row]);
  if (site.indices) m += " of sample " + std::to_string(site.indices[row]);
  m += " (row " + std::to_string(row);
  if (site.replica != label_site::unknown) m += " of replica " + std::to_string(site.replica) + "'s shard";
  if (site.step != label_site::unknown) m += " at step " + std::to_string(site.step);
  m += ") is outside [0, " + std::to_string(classes) + "): the model has " + std::to_string(outputs) + " output" +
       (outputs == 1 ? "" : "s");
  throw data_error(m);
}

}  // namespace lockstep
