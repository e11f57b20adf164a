#pragma once
/// @file collective_ids.hpp
/// The one owner of collective ids. Every collective a strategy issues through its reducer (or
/// a reducer issues internally) is named by an id: the model's gradient buckets take ids
/// [0, max_buckets), and a few ids after them are reserved for the strategy's own collectives
/// and the reducers' internal phases. Reducers size their per-id tables for `count` ids. No other
/// file computes an id: each names the constant it means.

#include <cstddef>
#include <string>

#include <lockstep/core/error.hpp>

namespace lockstep {

/// The ids that name collectives (see the file comment). A strategy refuses a model with more
/// than max_buckets buckets; a reducer built from reducer_config serves ids [0, count).
struct collective_ids {
  static constexpr std::size_t max_buckets = 255;              ///< gradient buckets a model may have: ids [0, max_buckets)
  static constexpr std::size_t all_reduce = max_buckets;       ///< strategy::all_reduce, called from inside run()
  static constexpr std::size_t barrier = all_reduce + 1;       ///< every replica arrives
  static constexpr std::size_t broadcast = barrier + 1;        ///< a broadcast from one replica
  static constexpr std::size_t broadcast_done = broadcast + 1; ///< second phase of a broadcast, for reducers that need one
  static constexpr std::size_t epilogue_sums = broadcast_done + 1;  ///< the sum of the epilogue's chunk sums (reduces_to_slices_v)
  static constexpr std::size_t gather_slices = epilogue_sums + 1;   ///< the gather of the updated slices (reduces_to_slices_v)
  static constexpr std::size_t setup = gather_slices + 1;      ///< a reducer's one-time set-up (e.g. making communicators)
  static constexpr std::size_t count = setup + 1;              ///< ids a reducer serves: [0, count)

  /// True when `id` names a gradient bucket (not a reserved id).
  [[nodiscard]] static constexpr bool is_bucket(std::size_t id) noexcept { return id < max_buckets; }
  /// True when a reducer's start() may be given `id`: a bucket or the strategy's all_reduce.
  [[nodiscard]] static constexpr bool is_sum(std::size_t id) noexcept { return is_bucket(id) || id == all_reduce; }
  /// True when `id` is one of the reserved ids.
  [[nodiscard]] static constexpr bool is_reserved(std::size_t id) noexcept { return id >= max_buckets && id < count; }

  /// Throws config_error naming `who` unless a model with `buckets` gradient buckets fits the bucket ids.
  static void check_buckets(std::size_t buckets, const char* who) {
    if (buckets > max_buckets)
      throw config_error(std::string(who) + ": the model has " + std::to_string(buckets) + " gradient buckets, more than the " +
                         std::to_string(max_buckets) + " a strategy serves; raise strategy_options::bucket_bytes");
  }

  /// The collective in words, for messages: "bucket 3", "a barrier", "a broadcast", ...
  [[nodiscard]] static std::string name(std::size_t id) {
    if (is_bucket(id)) return "bucket " + std::to_string(id);
    switch (id) {
      case all_reduce: return "an all_reduce";
      case barrier: return "a barrier";
      case broadcast: return "a broadcast";
      case broadcast_done: return "the end of a broadcast";
      case epilogue_sums: return "the sum of the epilogue's chunk sums";
      case gather_slices: return "the gather of the updated slices";
      case setup: return "the reducer's set-up";
      default: return "collective id " + std::to_string(id) + " (beyond the reserved ids)";
    }
  }
};

}  // namespace lockstep
