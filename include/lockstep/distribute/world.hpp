#pragma once
/// @file world.hpp
/// A world: the processes (workers) a strategy's replicas belong to. One process is
/// `local_world`; the processes of an MPI job are `mpi_world` (distribute/mpi_world.hpp). The one
/// strategy class, `mirrored_strategy<Kind, Reducer, Determinism, World>`, is written once for
/// every world: a world tells it
///  - who this process is: `rank()`, `size()`, `is_chief()` (rank 0 writes progress, metrics and
///    checkpoints);
///  - how global batches are cut: `plan()` (a shard_plan: the shards over every replica of every
///    worker, and this process's first one), `global_replicas()`;
///  - how to add per-worker values: `sum(values)` (the same bits on every worker, in rank order);
///  - what a failure leaves: `recovers_after_failure` (a local world recovers; an MPI world's
///    collectives no longer match after a failure, so the strategy refuses further use).
/// `fit`, `evaluate` and `predict` ask a strategy for its world (`world_of`); a strategy without
/// one (a user's) is a local world over its replicas.
///
/// The members a world offers the strategy itself (failure handling, the collective-plan check,
/// the row exchange of batch-coupled layers, the micro-shard sum across workers) are listed in
/// docs/distribute.md; local_world shows them in their simplest form.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/concepts.hpp>

namespace lockstep {

namespace detail {
class row_exchange_span;
}  // namespace detail

/// What every worker of a job must agree on before the first collective (the "collective plan"):
/// named 64-bit values (the model signature, the bucket plan, the reducer, the determinism level,
/// the options that change collectives, the library version). A world compares them across
/// workers and refuses a mismatch with a config_error naming both ranks and the field.
class collective_plan {
public:
  /// One named value; `shown` says whether messages print the value itself (a count) or only
  /// that it differs (a hash).
  struct field {
    std::string name;          ///< what it is, for messages ("bucket_bytes", "model signature")
    std::uint64_t value = 0;   ///< the value, or a hash of it
    bool shown = true;         ///< print the value in a mismatch message
  };
  /// The most fields a plan holds (they travel in a fixed-size message).
  static constexpr std::size_t max_fields = 24;

  /// Adds a value that messages print.
  collective_plan& add(std::string name, std::uint64_t value) {
    return push(std::move(name), value, true);
  }
  /// Adds a hash of `text` (a type name, a layout); messages say only that it differs.
  collective_plan& add_hashed(std::string name, std::string_view text) {
    return push(std::move(name), hash(text), false);
  }
  /// The fields, in the order they were added (a mismatch names the first differing one).
  [[nodiscard]] const std::vector<field>& fields() const noexcept { return fields_; }
  /// Sets what a mismatch message tells the user to do (by default: build the same model with
  /// the same strategy options and lockstep version on every worker).
  collective_plan& remedy(std::string text) {
    remedy_ = std::move(text);
    return *this;
  }
  /// What a mismatch message tells the user to do.
  [[nodiscard]] const std::string& remedy() const noexcept { return remedy_; }

  /// FNV-1a over `text` (stable across processes and builds), continuing from `h` (the hash of
  /// what came before; FNV's offset basis by default), so a long input can be hashed in parts.
  [[nodiscard]] static constexpr std::uint64_t hash(std::string_view text, std::uint64_t h = 0xcbf29ce484222325ull) noexcept {
    for (const char c : text) {
      h ^= static_cast<unsigned char>(c);
      h *= 0x100000001b3ull;
    }
    return h;
  }

private:
  collective_plan& push(std::string name, std::uint64_t value, bool shown) {
    if (fields_.size() == max_fields)
      throw config_error("lockstep::collective_plan: more than " + std::to_string(max_fields) + " fields");
    fields_.push_back(field{std::move(name), value, shown});
    return *this;
  }
  std::vector<field> fields_;
  std::string remedy_ = "every worker must build the same model with the same strategy options and lockstep version";
};

/// A world as fit, evaluate and predict see it (see the file comment).
template <class W>
concept world = requires(W& w, const W& cw, std::span<double> v) {
  { cw.rank() } -> std::convertible_to<std::size_t>;
  { cw.size() } -> std::convertible_to<std::size_t>;
  { cw.is_chief() } -> std::convertible_to<bool>;
  { cw.plan() } -> std::convertible_to<shard_plan>;
  { cw.global_replicas() } -> std::convertible_to<std::size_t>;
  w.sum(v);
  { W::recovers_after_failure } -> std::convertible_to<bool>;
};

/// One process: every replica is local, sums over workers change nothing, failures are recovered.
class local_world {
public:
  /// A world of one process with `local_replicas` replicas.
  explicit local_world(std::size_t local_replicas = 1) noexcept : local_(local_replicas) {}

  /// This process's rank: 0.
  [[nodiscard]] std::size_t rank() const noexcept { return 0; }
  /// Number of workers: 1.
  [[nodiscard]] std::size_t size() const noexcept { return 1; }
  /// True: the one process writes progress, metrics and checkpoints.
  [[nodiscard]] bool is_chief() const noexcept { return true; }
  /// Replicas of this process.
  [[nodiscard]] std::size_t local_replicas() const noexcept { return local_; }
  /// Replicas over every worker: the local ones.
  [[nodiscard]] std::size_t global_replicas() const noexcept { return local_; }
  /// One shard per local replica.
  [[nodiscard]] shard_plan plan() const noexcept { return {local_, 0}; }
  /// Sums over the workers: one worker, nothing to add.
  void sum(std::span<double>) noexcept {}
  /// Every worker arrives: there is only this one.
  void barrier() noexcept {}
  /// Every worker's `block` in rank order (a trace's events, fit_trace.hpp): this one's.
  [[nodiscard]] std::vector<std::vector<std::uint8_t>> gather_blocks(std::span<const std::uint8_t> block) const {
    return {std::vector<std::uint8_t>(block.begin(), block.end())};
  }
  /// A failure leaves the strategy usable (its collectives are re-armed).
  static constexpr bool recovers_after_failure = true;
  /// The world in words, for a strategy's description (empty: nothing to add).
  [[nodiscard]] std::string describe() const { return {}; }

  // --- what mirrored_strategy asks of a world (docs/distribute.md, "Worlds") ---
  /// Nothing to check: a local strategy is always usable.
  void check_usable() const noexcept {}
  /// Runs `f` (a failure is handled by the strategy's executor and the strategy stays usable).
  template <class F, class Abort>
  decltype(auto) guarded(F&& f, Abort&&) {
    return std::forward<F>(f)();
  }
  /// One process always agrees with itself.
  void agree(const collective_plan&) noexcept {}
  /// No rows outside this process: batch-coupled layers exchange rows between local replicas only.
  [[nodiscard]] detail::row_exchange_span* row_span() noexcept { return nullptr; }

private:
  std::size_t local_;
};

/// True for the worlds of lockstep and for a user's type that satisfies `world`.
template <class W>
inline constexpr bool is_world_v = world<W>;

namespace detail {

/// The world of strategy `s`: its `world()` when it has one, else a local world over its
/// replicas (returned by value).
template <class S>
decltype(auto) world_of(S& s) {
  if constexpr (requires { requires world<std::remove_cvref_t<decltype(s.world())>>; })
    return s.world();
  else
    return local_world(s.num_replicas());
}

}  // namespace detail

}  // namespace lockstep
