#pragma once
/// @file mpi_world.hpp
/// `mpi_world`: the workers of an MPI job as a world (see world.hpp; link lockstep::mpi). Every
/// MPI call goes through the job's communication thread (detail::mpi_channel), owned by the
/// strategy (multi_worker_mirrored), so MPI_THREAD_SERIALIZED suffices.
///
/// - Plan: every worker tells its local replica count at construction (a collective), so worker
///   w's replicas take the shards o_w .. o_w + L_w - 1 of every global batch, o_w being the
///   replicas of the workers of lower rank (counts may differ between workers).
/// - Sums over workers add the workers' values in rank order: the same bits on every worker.
/// - The collective plan (world.hpp) is compared across workers before the first collective; a
///   mismatch is a config_error naming both ranks and the first differing field, on every worker.
/// - Failure: after any failure the channel is marked broken and the strategy refuses further
///   use (the workers' collectives no longer match); the error names this worker's rank.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/detail/row_exchange.hpp>
#include <lockstep/distribute/mpi.hpp>
#include <lockstep/distribute/reducers/detail/host_sum.hpp>
#include <lockstep/distribute/world.hpp>

namespace lockstep {

namespace detail {

/// The rows of other workers for the row exchange of batch-coupled layers (batch_norm): an
/// all-gather of every worker's row range, then an in-place all-gather of the rows themselves.
class mpi_row_span final : public row_exchange_span {
public:
  /// A span over the workers of `ch`.
  explicit mpi_row_span(mpi_channel& ch)
      : channel_(&ch), ranges_(2 * static_cast<std::size_t>(ch.size())), counts_(ranges_.size() / 2),
        displs_(ranges_.size() / 2) {}

  /// See row_exchange_span::gather.
  void gather(std::byte* table, std::size_t elem_bytes, std::size_t first_row, std::size_t rows, std::size_t width,
              std::size_t total_rows) override {
    const auto w = static_cast<std::size_t>(channel_->size()), me = static_cast<std::size_t>(channel_->rank());
    std::fill(ranges_.begin(), ranges_.end(), 0.0);
    ranges_[2 * me] = static_cast<double>(first_row);
    ranges_[2 * me + 1] = static_cast<double>(rows);
    channel_->run(mpi_channel::job{.kind = mpi_channel::op::gather_doubles, .data = ranges_.data(), .count = 2});
    std::size_t covered = 0;
    for (std::size_t p = 0; p < w; ++p) {
      const auto lo = static_cast<std::size_t>(ranges_[2 * p]), n = static_cast<std::size_t>(ranges_[2 * p + 1]);
      if ((lo + n) * width > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw config_error("lockstep::multi_worker: a batch-coupled layer's exchange exceeds MPI's int count");
      counts_[p] = static_cast<int>(n * width);
      displs_[p] = static_cast<int>(lo * width);
      covered += n;
    }
    if (covered != total_rows)
      throw shape_error("lockstep::multi_worker: the workers hold " + std::to_string(covered) + " rows of a global batch of " +
                        std::to_string(total_rows) + " in a batch-coupled layer's exchange");
    channel_->run(mpi_channel::job{
        .kind = elem_bytes == sizeof(double) ? mpi_channel::op::gather_doubles_v : mpi_channel::op::gather_floats_v,
        .data = table, .count = total_rows * width, .counts = &counts_, .displs = &displs_});
  }

  /// True on rank 0.
  [[nodiscard]] bool first_process() const noexcept override { return channel_->rank() == 0; }

private:
  mpi_channel* channel_;
  std::vector<double> ranges_;
  std::vector<int> counts_, displs_;
};

/// `n` as an MPI count. @throws config_error naming `what` when it does not fit an int.
inline int mpi_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw config_error(std::string("lockstep::multi_worker: ") + what + " of " + std::to_string(n) +
                       " elements exceeds MPI's int count; raise strategy_options::micro_shard_rows or use fewer "
                       "parameters per worker");
  return static_cast<int>(n);
}

}  // namespace detail

/// The workers of an MPI job (see the file comment). Made by multi_worker_mirrored, which owns
/// the communication thread; constructing it is collective over the workers.
class mpi_world {
public:
  /// The world of the processes of `channel`, this one driving `local_replicas` replicas.
  /// Collective: every worker's replica count is gathered.
  /// @throws config_error when a worker has no replica; what the channel throws.
  mpi_world(detail::mpi_channel& channel, std::size_t local_replicas)
      : channel_(&channel),
        rank_(static_cast<std::size_t>(channel.rank())),
        size_(static_cast<std::size_t>(channel.size())),
        local_(local_replicas),
        span_(std::make_unique<detail::mpi_row_span>(channel)) {
    std::vector<double> counts(size_, 0.0);
    counts[rank_] = static_cast<double>(local_replicas);
    channel.run(job{.kind = op::gather_doubles, .data = counts.data(), .count = 1});
    firsts_.assign(size_ + 1, 0);
    for (std::size_t p = 0; p < size_; ++p) {
      const auto n = static_cast<std::size_t>(counts[p]);
      if (n == 0) throw config_error("lockstep::multi_worker: worker rank " + std::to_string(p) + " has no replica");
      firsts_[p + 1] = firsts_[p] + n;
    }
    first_ = firsts_[rank_];
    total_ = firsts_[size_];
  }

  /// This worker's rank.
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  /// Number of workers.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// True on rank 0, the worker that writes progress, metrics and checkpoints.
  [[nodiscard]] bool is_chief() const noexcept { return rank_ == 0; }
  /// Replicas of this worker.
  [[nodiscard]] std::size_t local_replicas() const noexcept { return local_; }
  /// Replicas over every worker.
  [[nodiscard]] std::size_t global_replicas() const noexcept { return total_; }
  /// Every global batch is cut into global_replicas() shards; this worker's replicas take the
  /// local_replicas() from the replicas of the workers of lower rank on.
  [[nodiscard]] shard_plan plan() const noexcept { return {total_, first_}; }
  /// The MPI thread level in force (MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE).
  [[nodiscard]] int thread_level() const noexcept { return channel_->thread_level(); }
  /// True when the workers' sums run in a shared-memory window (every worker on one machine).
  [[nodiscard]] bool shares_memory() const noexcept { return channel_->shared_memory(); }
  /// The communication thread every MPI call of the strategy goes through (for reducers).
  [[nodiscard]] detail::mpi_channel& channel() noexcept { return *channel_; }

  /// Makes the communication thread's scratch hold `floats` (a bucket or a broadcast of that size)
  /// so later steps allocate nothing.
  void reserve_floats(std::size_t floats) { channel_->reserve_floats(floats); }

  /// Sums each element of `v` over the workers, in rank order (the same bits on every worker). Collective.
  void sum(std::span<double> v) {
    check_usable();
    const std::size_t n = v.size();
    if (size_ == 1 || n == 0) return;
    gather_.assign(size_ * n, 0.0);
    std::copy(v.begin(), v.end(), gather_.begin() + static_cast<std::ptrdiff_t>(rank_ * n));
    channel_->run(job{.kind = op::gather_doubles, .data = gather_.data(), .count = n});
    for (std::size_t i = 0; i < n; ++i) {
      double s = gather_[i];
      for (std::size_t p = 1; p < size_; ++p) s += gather_[p * n + i];
      v[i] = s;
    }
  }

  /// Every worker arrives. Collective.
  void barrier() {
    check_usable();
    channel_->run(job{.kind = op::barrier});
  }

  /// Every worker's `block` (bytes of any length, a trace's events) in rank order, on every
  /// worker: one sum of the lengths, then one all-gather of blocks padded to the longest.
  /// Collective; not for the steps (it allocates).
  [[nodiscard]] std::vector<std::vector<std::uint8_t>> gather_blocks(std::span<const std::uint8_t> block) {
    check_usable();
    std::vector<double> lengths(size_, 0.0);
    lengths[rank_] = static_cast<double>(block.size());
    sum(lengths);
    std::size_t longest = 0;
    for (const double l : lengths) longest = std::max(longest, static_cast<std::size_t>(l));
    std::vector<std::vector<std::uint8_t>> out(size_);
    if (longest == 0) return out;
    std::vector<std::uint8_t> all(longest * size_, 0);
    std::copy(block.begin(), block.end(), all.begin() + static_cast<std::ptrdiff_t>(rank_ * longest));
    if (size_ > 1) {
      channel_->run(job{.kind = op::gather_bytes, .data = all.data(), .count = longest});
    }
    for (std::size_t p = 0; p < size_; ++p) {
      const auto first = all.begin() + static_cast<std::ptrdiff_t>(p * longest);
      out[p].assign(first, first + static_cast<std::ptrdiff_t>(lengths[p]));
    }
    return out;
  }

  /// After a failure the workers' collectives no longer match: the strategy refuses further use.
  static constexpr bool recovers_after_failure = false;
  /// The world in words: "rank 0 of 2 workers".
  [[nodiscard]] std::string describe() const {
    return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " workers";
  }

  // --- what mirrored_strategy asks of a world ---

  /// @throws config_error when a failure has left the strategy unusable.
  void check_usable() const {
    if (channel_->broken())
      throw config_error("lockstep::multi_worker: rank " + std::to_string(rank_) +
                         ": the strategy is unusable after a failure (the workers' collectives no longer match); end "
                         "the job");
  }

  /// Runs `f`; a failure breaks the channel, calls `abort` (the strategy's reducer), and reaches
  /// the caller as a replica_error naming this worker's rank with the original nested.
  template <class F, class Abort>
  decltype(auto) guarded(F&& f, Abort&& abort) {
    try {
      return std::forward<F>(f)();
    } catch (const replica_error& e) {
      channel_->abort(e.what());
      abort();
      std::throw_with_nested(replica_error(prefix() + e.what(), e.replica(), e.step()));
    } catch (const std::exception& e) {
      channel_->abort(e.what());
      abort();
      std::throw_with_nested(replica_error(prefix() + e.what()));
    }
  }

  /// Compares `plan` across the workers (one all-gather of a fixed-size message). Collective.
  /// @throws config_error on every worker, naming the first worker whose plan differs from rank
  ///         0's, the field and both values (or "differs" for a hashed field).
  void agree(const collective_plan& plan) {
    check_usable();
    constexpr std::size_t words = collective_plan::max_fields + 1;
    std::vector<std::uint64_t> all(words * size_, 0);
    const auto& f = plan.fields();
    all[rank_ * words] = f.size();
    for (std::size_t i = 0; i < f.size(); ++i) all[rank_ * words + 1 + i] = f[i].value;
    channel_->run(job{.kind = op::gather_bytes, .data = all.data(), .count = words * sizeof(std::uint64_t)});
    for (std::size_t p = 1; p < size_; ++p) {
      const std::uint64_t* a = all.data();
      const std::uint64_t* b = all.data() + p * words;
      if (a[0] != b[0])
        throw config_error(mismatch(p, "the number of plan fields (different lockstep builds)", a[0], b[0], true,
                                    plan.remedy()));
      for (std::size_t i = 0; i < std::min<std::size_t>(a[0], f.size()); ++i)
        if (a[1 + i] != b[1 + i]) throw config_error(mismatch(p, f[i].name, a[1 + i], b[1 + i], f[i].shown, plan.remedy()));
    }
  }

  /// The row exchange with the other workers, for batch-coupled layers.
  [[nodiscard]] detail::row_exchange_span* row_span() noexcept { return span_.get(); }

  // --- the micro-shard sum of determinism::replica_count_invariant across workers ---
  // Worker u's replicas compute micro-shards [K o_u / G, K (o_u + L_u) / G) (o_u: its first
  // replica among all G, L_u: its replicas); the parameters are cut
  // into W slices (slice_of). Each worker packs its micro-shards' gradients by destination slice
  // (pack_offset), one all-to-all gives every worker all k_total gradients of its slice in
  // micro-shard order, each sums its slice in that order, and one all-gather completes the sum.

  /// The micro-shards [first, last) of `k_total` that this worker computes.
  [[nodiscard]] std::pair<std::size_t, std::size_t> micro_shards(std::size_t k_total) const noexcept {
    return micro_shards_of(rank_, k_total);
  }
  /// The micro-shards [first, last) of `k_total` that worker v computes.
  [[nodiscard]] std::pair<std::size_t, std::size_t> micro_shards_of(std::size_t v, std::size_t k_total) const noexcept {
    return {k_total * firsts_[v] / total_, k_total * firsts_[v + 1] / total_};
  }
  /// The parameters [first, last) of `params` whose micro-shard sum this worker forms.
  [[nodiscard]] std::pair<std::size_t, std::size_t> param_slice(std::size_t params) const noexcept {
    return detail::slice_of<float>(params, rank_, size_);
  }
  /// Where element `lo_v` of destination slice v of this worker's local micro-shard `k_local`
  /// (of `k_mine`) starts in the packed send buffer: k_mine · lo_v + k_local · |slice v|.
  [[nodiscard]] static std::size_t pack_offset(std::size_t k_mine, std::size_t k_local, std::size_t lo_v,
                                               std::size_t hi_v) noexcept {
    return k_mine * lo_v + k_local * (hi_v - lo_v);
  }
  /// The parameter slice of worker v.
  [[nodiscard]] std::pair<std::size_t, std::size_t> slice_of_worker(std::size_t params, std::size_t v) const noexcept {
    return detail::slice_of<float>(params, v, size_);
  }

  /// The all-to-all: `send` holds this worker's micro-shard gradients packed by destination
  /// slice; `recv` receives k_total × |this worker's slice| floats in micro-shard order. Collective.
  void exchange_micro_shards(const float* send, float* recv, std::size_t k_total, std::size_t params) {
    check_usable();
    const auto [klo, khi] = micro_shards(k_total);
    const std::size_t k_mine = khi - klo;
    const auto [mlo, mhi] = param_slice(params);
    send_counts_.assign(size_, 0);
    send_displs_.assign(size_, 0);
    recv_counts_.assign(size_, 0);
    recv_displs_.assign(size_, 0);
    for (std::size_t v = 0; v < size_; ++v) {
      const auto [lo, hi] = slice_of_worker(params, v);
      send_counts_[v] = detail::mpi_count(k_mine * (hi - lo), "a micro-shard exchange");
      send_displs_[v] = detail::mpi_count(k_mine * lo, "a micro-shard exchange");
      const auto [ku_lo, ku_hi] = micro_shards_of(v, k_total);
      recv_counts_[v] = detail::mpi_count((ku_hi - ku_lo) * (mhi - mlo), "a micro-shard exchange");
      recv_displs_[v] = detail::mpi_count(ku_lo * (mhi - mlo), "a micro-shard exchange");
    }
    // MPI's send buffer is const, its C binding's argument is not.
    channel_->run(job{.kind = op::alltoallv_floats, .data = const_cast<float*>(send), .counts = &send_counts_,
                      .displs = &send_displs_, .recv = recv, .recv_counts = &recv_counts_, .recv_displs = &recv_displs_});
  }

  /// The all-gather: every worker's summed slice of `data` (`params` floats) reaches every worker. Collective.
  void gather_slices(float* data, std::size_t params) {
    check_usable();
    send_counts_.assign(size_, 0);
    send_displs_.assign(size_, 0);
    for (std::size_t v = 0; v < size_; ++v) {
      const auto [lo, hi] = slice_of_worker(params, v);
      send_counts_[v] = detail::mpi_count(hi - lo, "a parameter slice");
      send_displs_[v] = detail::mpi_count(lo, "a parameter slice");
    }
    channel_->run(job{.kind = op::gather_floats_v, .data = data, .counts = &send_counts_, .displs = &send_displs_});
  }

  /// Every worker's per-micro-shard values (`width` doubles per micro-shard, this worker's at
  /// micro_shards()) reach every worker, so each holds all k_total · width. Collective.
  void gather_micro_values(double* values, std::size_t k_total, std::size_t width) {
    check_usable();
    recv_counts_.assign(size_, 0);
    recv_displs_.assign(size_, 0);
    for (std::size_t v = 0; v < size_; ++v) {
      const auto [lo, hi] = micro_shards_of(v, k_total);
      recv_counts_[v] = detail::mpi_count((hi - lo) * width, "a micro-shard loss gather");
      recv_displs_[v] = detail::mpi_count(lo * width, "a micro-shard loss gather");
    }
    channel_->run(job{.kind = op::gather_doubles_v, .data = values, .counts = &recv_counts_, .displs = &recv_displs_});
  }

private:
  using job = detail::mpi_channel::job;  // a job of the channel
  using op = detail::mpi_channel::op;    // what a job does

  std::string prefix() const {
    return "lockstep: worker rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": ";
  }

  std::string mismatch(std::size_t p, const std::string& field, std::uint64_t a, std::uint64_t b, bool shown,
                       const std::string& remedy) const {
    std::string text = "lockstep::multi_worker: rank " + std::to_string(rank_) +
                       ": the workers' plans differ (they would wait in collectives that others never start, or "
                       "drift apart): worker rank " + std::to_string(p) + "'s " + field;
    if (shown)
      text += " is " + std::to_string(b) + ", rank 0's is " + std::to_string(a);
    else
      text += " differs from rank 0's";
    return text + " (" + remedy + ")";
  }

  detail::mpi_channel* channel_;
  std::size_t rank_, size_, local_;
  std::size_t first_ = 0, total_ = 0;
  std::vector<std::size_t> firsts_;  // firsts_[v]: worker v's first replica among all; firsts_[size_]: all
  std::unique_ptr<detail::mpi_row_span> span_;
  std::vector<double> gather_;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
};

}  // namespace lockstep
