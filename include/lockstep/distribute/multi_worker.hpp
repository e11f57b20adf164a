#pragma once
/// @file multi_worker.hpp
/// `multi_worker_mirrored<Kind, Determinism>`: synchronous data parallelism over several MPI
/// processes (workers), each driving its own local replicas (link lockstep::mpi).
///
/// Every worker runs the same input pipeline and sees the same global batches. A global batch is
/// cut into workers × local replicas shards (data::split over all replicas of all workers); worker
/// w's replica r gets shard w·L + r, so every sample reaches exactly one replica of one worker.
/// Aggregation is hierarchical and fixed at compile time: the shared-memory all-reduce between
/// the local replicas of a bucket first, then — as soon as the last local replica finished its
/// part — the bucket is handed to the worker's communication thread, which reduces it across the
/// workers (a fixed-order reduce-scatter + all-gather over MPI) while the backward pass of the
/// layers below continues. Gradients are divided by the GLOBAL sample count.
///
/// Determinism: run_to_run (the summation order is fixed by the replica and worker counts);
/// replica_count_invariant (host memory): the global batch is cut into fixed micro-shards whose
/// gradient sums are gathered from every worker and summed in micro-shard order, so 1×4, 2×2 and
/// 4×1 workers × replicas give bitwise the same parameters as one process.
///
/// num_replicas() and run() are per process; world_size(), rank() and global_replicas() describe
/// the job. fit/evaluate ask the strategy how to shard a global batch (shard_plan), sum metric
/// sums over workers (sum_over_workers) and only the chief (rank 0) writes progress, metrics and
/// checkpoints (is_chief).
///
/// Failure: a failure on one worker reaches its caller as a replica_error naming the worker's
/// rank; the strategy is unusable afterwards (the workers' collectives no longer match): end the
/// job (mpi_environment::abort_on_exit or abort). A worker that waits for another longer than
/// strategy_options::timeout throws timeout_error naming the missing rank(s) and the bucket.
///
/// GPU replicas (`multi_worker_mirrored<gpus>`): one NCCL communicator over every GPU of every
/// worker, bootstrapped through this strategy's MPI channel; see multi_worker_nccl.cuh, which
/// this header includes itself when compiled by nvcc with lockstep::nccl (LOCKSTEP_HAS_CUDA and
/// LOCKSTEP_HAS_NCCL).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/detail/row_exchange.hpp>
#include <lockstep/distribute/device_set.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/mpi.hpp>
#include <lockstep/distribute/reducers/host.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/steps/micro_shard_step.hpp>
#include <lockstep/distribute/steps/overlapped_step.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

/// Hierarchical host reducer: the shared-memory all-reduce between local replicas, then a
/// fixed-order reduce-scatter + all-gather across workers on the communication thread, started by
/// the last local replica to finish a bucket (so it overlaps the rest of the backward pass).
class mpi_host_allreduce {
  struct engine : detail::host_comm {
    using detail::host_comm::host_comm;
    mpi_host_allreduce* self = nullptr;
  };

public:
  /// A reducer for `c.replicas` local replicas whose inter-worker part runs on `channel`.
  mpi_host_allreduce(const reducer_config& c, detail::mpi_channel& channel)
      : comm_(c.replicas, c.timeout, c.ids, 0),
        channel_(&channel),
        arrived_(new std::atomic<std::uint64_t>[c.ids]),
        tickets_(c.ids, 0),
        bytes_(c.ids, 0) {
    comm_.self = this;
    for (std::size_t i = 0; i < c.ids; ++i) arrived_[i].store(0);
  }
  /// The strategy's form: as above (host replicas need nothing of their ordinals).
  mpi_host_allreduce(const reducer_config& c, detail::mpi_channel& channel, const std::vector<std::size_t>&)
      : mpi_host_allreduce(c, channel) {}

  /// Replicas over all workers: every worker has as many as this one.
  [[nodiscard]] std::size_t global_replicas() const noexcept {
    return comm_.replicas() * static_cast<std::size_t>(channel_->size());
  }
  /// The global index of this worker's first replica.
  [[nodiscard]] std::size_t first_replica() const noexcept {
    return comm_.replicas() * static_cast<std::size_t>(channel_->rank());
  }

  /// Local replica `replica` contributes `count` elements at `data` to bucket `bucket`.
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t bucket) {
    static_assert(std::is_same_v<T, float>, "lockstep::multi_worker: the MPI host reducer sums float gradients");
    comm_.start(replica, bucket, data, count, &work);
  }
  /// Completes the bucket: every local replica holds the sum over all replicas of all workers.
  template <class Ctx>
  void wait(std::size_t replica, Ctx&, std::size_t bucket) {
    comm_.wait(replica, bucket);
    channel_->wait(tickets_[bucket]);
    if (replica != 0) {
      const std::size_t n = counts_at(bucket);
      if (n) std::memcpy(comm_.pointer(bucket, replica), comm_.pointer(bucket, 0), n * sizeof(float));
    }
  }
  /// Copies `count` elements of local replica `root` on rank 0 to every replica of every worker.
  template <class Ctx, class T>
  void broadcast(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t root) {
    comm_.broadcast(replica, data, count, sizeof(T), root);
    if (replica == 0) {
      detail::mpi_channel::job j;
      j.kind = detail::mpi_channel::op::broadcast_bytes;
      j.data = data;
      j.count = count * sizeof(T);
      channel_->run(j);
    }
    comm_.broadcast(replica, data, count, sizeof(T), 0);
  }
  /// Every local replica of every worker arrives.
  void barrier(std::size_t replica) {
    comm_.barrier(replica);
    if (replica == 0) channel_->run(detail::mpi_channel::job{});
    comm_.barrier(replica);
  }
  /// Releases local waiters and marks the channel unusable.
  void abort() noexcept {
    comm_.abort();
    channel_->abort();
  }
  /// Re-arms the local engine (the channel stays unusable after a failure).
  void reset() noexcept { comm_.reset(); }

private:
  std::size_t counts_at(std::size_t bucket) const noexcept { return bytes_[bucket]; }

  static void work(detail::host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t seq) {
    detail::allreduce_work<float>(c, r, bucket, count, seq);
    auto& e = static_cast<engine&>(c);
    mpi_host_allreduce& self = *e.self;
    if ((self.arrived_[bucket].fetch_add(1) + 1) % c.replicas() == 0) {
      detail::mpi_channel::job j;
      j.kind = detail::mpi_channel::op::sum_floats;
      j.data = c.pointer(bucket, 0);
      j.count = count;
      j.bucket = bucket;
      self.bytes_[bucket] = count;
      self.tickets_[bucket] = self.channel_->post(j);
    }
  }

  engine comm_;
  detail::mpi_channel* channel_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrived_;
  std::vector<std::uint64_t> tickets_;
  std::vector<std::size_t> bytes_;
};

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
    mpi_channel::job j;
    j.kind = mpi_channel::op::gather_doubles;
    j.data = ranges_.data();
    j.count = 2;
    channel_->run(j);
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
    j.kind = elem_bytes == sizeof(double) ? mpi_channel::op::gather_doubles_v : mpi_channel::op::gather_floats_v;
    j.data = table;
    j.count = total_rows * width;
    j.counts = &counts_;
    j.displs = &displs_;
    channel_->run(j);
  }

  /// True on rank 0.
  [[nodiscard]] bool first_process() const noexcept override { return channel_->rank() == 0; }

private:
  mpi_channel* channel_;
  std::vector<double> ranges_;
  std::vector<int> counts_, displs_;
};

/// replica_count_invariant across workers: fixed micro-shards of the global batch, split over
/// all replicas of all workers; their gradient sums are gathered from every worker and summed in
/// micro-shard order on every worker.
class multi_worker_micro_step {
public:
  multi_worker_micro_step(std::size_t replicas, const strategy_options& o, mpi_channel& ch)
      : sync_(replicas, o.timeout), rows_(o.micro_shard_rows), channel_(&ch) {
    if (rows_ == 0) throw config_error("lockstep: strategy_options::micro_shard_rows must be >= 1");
  }

  template <class Replicated, class Optimizer, class Loss>
  double run(executor& ex, Replicated& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b,
             const pass_info& info, const update_info& update) {
    using T = typename Replicated::value_type;
    static_assert(std::is_same_v<T, float>, "lockstep::multi_worker: replica_count_invariant sums float gradients");
    if constexpr (Replicated::model_type::couples_rows)
      throw config_error(
          "lockstep: determinism::replica_count_invariant runs the micro-shards of a replica one after another, "
          "so a layer that couples the rows of the global batch (batch_norm) cannot see them all; use "
          "determinism::run_to_run, under which batch_norm still computes its statistics over the global batch");
    constexpr std::size_t P = Replicated::param_count;
    const data::batch& g = *b.global;
    const std::size_t n = ex.size();
    const auto w = static_cast<std::size_t>(channel_->size()), me = static_cast<std::size_t>(channel_->rank());
    const std::size_t rows = g.rows();
    const std::size_t k_total = (rows + rows_ - 1) / rows_;
    const std::size_t gn = n * w;
    if (slots_.size() < k_total * P) slots_.resize(k_total * P);
    micro_loss_.assign(k_total, 0.0);
    counts_.assign(w, 0);
    displs_.assign(w, 0);
    loss_counts_.assign(w, 0);
    loss_displs_.assign(w, 0);
    for (std::size_t p = 0; p < w; ++p) {
      const std::size_t lo = k_total * p / w, hi = k_total * (p + 1) / w;
      if (hi * P > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw config_error("lockstep::multi_worker: the micro-shard gradients exceed MPI's int count; raise "
                           "strategy_options::micro_shard_rows");
      counts_[p] = static_cast<int>((hi - lo) * P);
      displs_[p] = static_cast<int>(lo * P);
      loss_counts_[p] = static_cast<int>(hi - lo);
      loss_displs_[p] = static_cast<int>(lo);
    }
    float* slots = slots_.data();
    const auto whole = data::whole(g);
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      const std::size_t gr = me * n + r;
      for (std::size_t k = k_total * gr / gn; k < k_total * (gr + 1) / gn; ++k) {
        micro_loss_[k] = rep.forward_backward(loss, detail::micro_shard(g, whole, k, rows_), info).sum;
        std::memcpy(slots + k * P, rep.model().gradients().data(), P * sizeof(T));
      }
      sync_.barrier(r);
      if (r == 0 && w > 1) {
        mpi_channel::job j;
        j.kind = mpi_channel::op::gather_floats_v;
        j.data = slots;
        j.counts = &counts_;
        j.displs = &displs_;
        const auto t1 = channel_->post(j);
        j.data = micro_loss_.data();
        j.kind = mpi_channel::op::gather_doubles_v;
        j.counts = &loss_counts_;
        j.displs = &loss_displs_;
        channel_->wait(t1);
        channel_->run(j);
      }
      sync_.barrier(r);
      detail::sum_slots_into_replicas(m, slots, P, k_total, r, n);
      sync_.barrier(r);
      rep.apply(opt, update);
    };
    ex.execute(job, info.step);
    double total = 0;
    for (const double l : micro_loss_) total += l;
    return total;
  }

  void abort() noexcept { sync_.abort(); }
  void reset() noexcept { sync_.reset(); }

private:
  host_comm sync_;
  std::size_t rows_;
  mpi_channel* channel_;
  std::vector<float> slots_;
  std::vector<double> micro_loss_;
  std::vector<int> counts_, displs_, loss_counts_, loss_displs_;
};

/// The gradient reducer of multi_worker_mirrored<Kind>: the hierarchical MPI reducer for kinds
/// with host memory. A backend adds its own by specialising this trait (gpus: one NCCL
/// communicator over every GPU of every worker, in multi_worker_nccl.cuh).
template <class Kind>
struct multi_worker_reducer {
  static constexpr bool available = device_memory<Kind>::host_accessible;  ///< the kind has a multi-worker path
  using type = mpi_host_allreduce;                                         ///< the reducer
};

}  // namespace detail

/// Synchronous data parallelism over MPI processes, each with local replicas of kind Kind.
/// @tparam Kind        the device kind of the local replicas: cpus, or gpus with
///                     multi_worker_nccl.cuh (nvcc, lockstep::nccl)
/// @tparam Determinism run_to_run, or replica_count_invariant (cpus only)
template <class Kind = cpus, determinism Determinism = determinism::run_to_run>
class multi_worker_mirrored {
  static_assert(detail::multi_worker_reducer<Kind>::available,
                "lockstep::multi_worker_mirrored: no multi-worker path for this device kind; the MPI path aggregates "
                "host memory (cpus); for gpus compile with nvcc and include <lockstep/distribute/multi_worker_nccl.cuh> "
                "(link lockstep::nccl and lockstep::mpi)");
  static_assert(Determinism == determinism::run_to_run || device_memory<Kind>::host_accessible,
                "lockstep::multi_worker_mirrored: determinism::replica_count_invariant is implemented for host memory "
                "(cpus) only; multi_worker_mirrored<gpus> trains under determinism::run_to_run");
  using reducer_type = typename detail::multi_worker_reducer<Kind>::type;

public:
  using strategy_concept = strategy_tag;                        ///< opts in to the strategy concept
  using kind_type = Kind;                                       ///< the device kind of every local replica
  using context_type = context_t<Kind>;                         ///< a replica's context
  using core_type = multi_worker_mirrored;                      ///< the class the training path is written for
  static constexpr determinism determinism_level = Determinism; ///< the determinism level
  /// The replicated model type for network Net with parameters of type T.
  template <class Net, class T = float>
  using model_type = basic_replicated<Net, Kind, T>;

  /// A strategy over the local devices `devices` (default: one replica) of every process of
  /// `comm` (default MPI_COMM_WORLD, which is duplicated). MPI must be initialised (see
  /// mpi_environment) with at least MPI_THREAD_SERIALIZED. Collective: every process constructs it.
  /// @throws config_error for a bad option, uninitialised MPI or a low thread level.
  explicit multi_worker_mirrored(const device_selection& devices = device_selection::first(1), strategy_options options = {},
                                 MPI_Comm comm = MPI_COMM_WORLD)
      : ordinals_(resolve_devices<Kind>(devices, backend_traits<Kind>::device_count(),
                                        std::string("lockstep::multi_worker_mirrored<") + backend_traits<Kind>::name + "s>")),
        options_(check(options)),
        channel_(comm, options_.timeout, options_.bucket_bytes / sizeof(float) + 1),
        identity_(std::make_shared<const strategy_identity>(strategy_identity{describe()})),
        reducer_(reducer_config{ordinals_.size(), options_.timeout, collective_ids::count, 0}, channel_, ordinals_),
        span_(channel_),
        step_(make_step()),
        exec_(ordinals_.size(), false, &abort_all, &reset_all, this) {}
  multi_worker_mirrored(const multi_worker_mirrored&) = delete;
  multi_worker_mirrored& operator=(const multi_worker_mirrored&) = delete;

  /// Local replicas of this process.
  [[nodiscard]] std::size_t num_replicas() const noexcept { return ordinals_.size(); }
  /// Number of workers (processes).
  [[nodiscard]] std::size_t world_size() const noexcept { return static_cast<std::size_t>(channel_.size()); }
  /// This worker's rank.
  [[nodiscard]] std::size_t rank() const noexcept { return static_cast<std::size_t>(channel_.rank()); }
  /// Replicas over all workers (cpus: every worker has the same number; gpus: the workers'
  /// counts may differ).
  [[nodiscard]] std::size_t global_replicas() const noexcept { return reducer_.global_replicas(); }
  /// True on rank 0, the worker that writes progress, metrics and checkpoints.
  [[nodiscard]] bool is_chief() const noexcept { return rank() == 0; }
  /// The MPI thread level in force (MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE).
  [[nodiscard]] int mpi_thread_level() const noexcept { return channel_.thread_level(); }
  /// True when the workers' sums run in a shared-memory window (every worker on one machine).
  [[nodiscard]] bool workers_share_memory() const noexcept { return channel_.shared_memory(); }
  /// The device ordinal of each local replica.
  [[nodiscard]] const std::vector<std::size_t>& device_ordinals() const noexcept { return ordinals_; }
  /// The options.
  [[nodiscard]] const strategy_options& options() const noexcept { return options_; }
  /// The strategy in words, for messages.
  [[nodiscard]] const std::string& description() const noexcept { return identity_->description; }
  /// How global batches are cut: this worker's replicas take shards o .. o + L - 1 of all
  /// global_replicas(), o being the replicas of the workers of lower rank (w·L with L each).
  [[nodiscard]] shard_plan plan() const noexcept { return {global_replicas(), reducer_.first_replica()}; }

  /// Makes one replica of Net per local device from `s`, identical on every worker (broadcast
  /// from rank 0's replica 0). Collective.
  template <class Net, class T = float>
  [[nodiscard]] model_type<Net, T> replicate(lockstep::seed s) {
    check_usable();
    std::vector<context_type> contexts;
    for (const std::size_t o : ordinals_)
      contexts.push_back(
          backend_traits<Kind>::make_context(o, replica_settings{options_.blas_threads, options_.flush_denormals, options_.tf32}));
    model_type<Net, T> m(std::move(contexts), s, options_.bucket_bytes, identity_);
    collective_ids::check_buckets(m.buckets().size, "lockstep::multi_worker");
    if constexpr (device_memory<Kind>::host_accessible) channel_.reserve_floats(m.stored_count);
    broadcast(m);
    return m;
  }

  /// Throws config_error unless this strategy made `m`.
  template <class Net, class T>
  void check_model(const model_type<Net, T>& m) const {
    if (!m.made_by(identity_.get()))
      throw config_error("lockstep::multi_worker: the model was made by another strategy (" + m.owner_description() +
                         ") and cannot be used with this one (" + description() + ")");
  }

  /// Copies rank 0's replica 0 parameters and optimiser state to every replica of every worker. Collective.
  template <class Net, class T>
  void broadcast(model_type<Net, T>& m) {
    check_model(m);
    check_usable();
    const std::size_t st = m.replica(0).optimizer_state().size();
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      reducer_.broadcast(r, rep.context(), rep.model().parameters().data(), m.stored_count, 0);
      if (st) reducer_.broadcast(r, rep.context(), rep.optimizer_state().data(), st, 0);
    };
    guarded([&] { exec_.execute(job); });
  }

  /// Runs fn(replica_index, shard) on every local replica with its shard of `b`.
  template <class F>
  auto run(F&& fn, const data::distributed_batch& b) {
    return exec_.run(std::forward<F>(fn), b);
  }
  /// Runs fn(replica_index) on every local replica.
  template <class F>
  void run_each(F&& fn) {
    exec_.run_each(std::forward<F>(fn));
  }
  /// Combines per-replica values of this process in replica order (see sum_over_workers for the job).
  template <class V>
  [[nodiscard]] auto reduce(reduce_op op, const std::vector<V>& values) const {
    return exec_.reduce(op, values);
  }

  /// Sums each element of `v` over the workers, in rank order (the same bits on every worker). Collective.
  void sum_over_workers(std::span<double> v) {
    check_usable();
    const std::size_t w = world_size(), n = v.size();
    if (w == 1 || n == 0) return;
    gather_.assign(w * n, 0.0);
    std::copy(v.begin(), v.end(), gather_.begin() + static_cast<std::ptrdiff_t>(rank() * n));
    detail::mpi_channel::job j;
    j.kind = detail::mpi_channel::op::gather_doubles;
    j.data = gather_.data();
    j.count = n;
    guarded([&] { channel_.run(j); });
    for (std::size_t i = 0; i < n; ++i) {
      double s = gather_[i];
      for (std::size_t p = 1; p < w; ++p) s += gather_[p * n + i];
      v[i] = s;
    }
  }

  /// In-place sum of `count` floats over every replica of every worker, called by every local
  /// replica from inside run_each (synchronous; collective_ids::all_reduce).
  template <class Ctx>
  void all_reduce(std::size_t replica, Ctx& ctx, float* data, std::size_t count) {
    reducer_.start(replica, ctx, data, count, collective_ids::all_reduce);
    reducer_.wait(replica, ctx, collective_ids::all_reduce);
  }

  /// Every replica of every worker arrives. Collective.
  void barrier() {
    check_usable();
    guarded([&] { channel_.run(detail::mpi_channel::job{}); });
  }

  /// One synchronous training step on this worker's shards of the global batch `b` (b.global is
  /// the whole global batch, b.shards this worker's shards); returns the loss summed over the
  /// global batch and the global count. Collective.
  template <class Net, class T, class Optimizer, class Loss>
  step_stats train_step(model_type<Net, T>& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b) {
    static_assert(optimizer<Optimizer>, "lockstep::train_step: the optimiser must satisfy lockstep::optimizer");
    static_assert(lockstep::loss<Loss>, "lockstep::train_step: the loss must satisfy lockstep::loss");
    check_model(m);
    check_usable();
    exec_.check_batch(b);
    const std::size_t total = b.global_size();
    if (total == 0) return {};
    const pass_info info{true, m.seed().value, m.step(), 0, 0};
    const update_info update{opt.lr, m.step() + 1, 1.0 / static_cast<double>(total)};
    step_stats out;
    guarded([&] {
      if constexpr (Determinism == determinism::run_to_run) {
        double l[1] = {step_.run(exec_, reducer_, m, opt, loss, b, info, update)};
        sum_over_workers(l);
        out.loss_sum = l[0];
      } else {
        out.loss_sum = step_.run(exec_, m, opt, loss, b, info, update);
      }
    });
    out.count = total;
    m.set_step(m.step() + 1);
    return out;
  }

private:
  // run_to_run: the overlapped step, whose reductions run also with one local replica, since the
  // other workers take part.
  using step_policy =
      std::conditional_t<Determinism == determinism::run_to_run, overlapped_step, detail::multi_worker_micro_step>;

  step_policy make_step() {
    if constexpr (Determinism == determinism::run_to_run)
      return step_policy(ordinals_.size(), options_, true, &span_);
    else
      return step_policy(ordinals_.size(), options_, channel_);
  }

  std::string describe() const {
    return std::string("multi-worker mirrored: rank ") + std::to_string(channel_.rank()) + " of " +
           std::to_string(channel_.size()) + " workers, " + backend_traits<Kind>::name + " devices " +
           detail::list_text(ordinals_);
  }

  static strategy_options check(strategy_options o) {
    if (o.timeout.count() <= 0) throw config_error("lockstep: strategy_options::timeout must be positive");
    if (o.blas_threads < 1)
      throw config_error("lockstep: strategy_options::blas_threads must be >= 1, got " + std::to_string(o.blas_threads));
    if (Determinism == determinism::replica_count_invariant && o.blas_threads != 1)
      throw config_error("lockstep: strategy_options::blas_threads must be 1 under replica_count_invariant");
    if (o.shard_optimizer)
      throw config_error("lockstep::multi_worker_mirrored: strategy_options::shard_optimizer is implemented for "
                         "mirrored (one process) only");
    o.pin_replicas = false;  // several processes share the machine's cores
    return o;
  }

  void check_usable() const {
    if (channel_.broken())
      throw config_error("lockstep::multi_worker: rank " + std::to_string(rank()) +
                         ": the strategy is unusable after a failure (the workers' collectives no longer match); end "
                         "the job");
  }

  // Runs f; a failure names this worker's rank (the original nested) and leaves the channel broken.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (const replica_error& e) {
      channel_.abort(e.what());
      reducer_.abort();
      std::throw_with_nested(replica_error("lockstep: worker rank " + std::to_string(rank()) + " of " +
                                               std::to_string(world_size()) + ": " + e.what(),
                                           e.replica(), e.step()));
    } catch (const std::exception& e) {
      channel_.abort(e.what());
      reducer_.abort();
      std::throw_with_nested(replica_error("lockstep: worker rank " + std::to_string(rank()) + " of " +
                                           std::to_string(world_size()) + ": " + e.what()));
    }
  }

  static void abort_all(void* self) noexcept {
    auto* s = static_cast<multi_worker_mirrored*>(self);
    s->reducer_.abort();
    s->step_.abort();
  }
  static void reset_all(void* self) noexcept {
    auto* s = static_cast<multi_worker_mirrored*>(self);
    s->reducer_.reset();
    s->step_.reset();
  }

  std::vector<std::size_t> ordinals_;
  strategy_options options_;
  detail::mpi_channel channel_;
  std::shared_ptr<const strategy_identity> identity_;
  reducer_type reducer_;
  detail::mpi_row_span span_;
  step_policy step_;
  std::vector<double> gather_;
  executor exec_;
};

}  // namespace lockstep

#if defined(__CUDACC__) && defined(LOCKSTEP_HAS_CUDA) && defined(LOCKSTEP_HAS_NCCL)
#include <lockstep/distribute/multi_worker_nccl.cuh>  // multi_worker_mirrored<gpus>
#endif
