#pragma once
/// @file row_exchange.hpp
/// Internal: the shared-memory row exchange of the host strategies. Replicas copy their rows into
/// one host table at the rows' global positions; once all have, every replica reads the whole
/// table. Three barriers per call: everyone has finished reading the previous table; the table
/// is large enough (grown by replica 0 only when a call needs more, so a steady state allocates
/// nothing); every row is written. Waits are bounded and abortable like the reducers'.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/memory/buffer.hpp>

namespace lockstep::detail {

/// Extends a row exchange beyond this process: once the local replicas' rows are in the table,
/// local replica 0 calls `gather` to fill in the rows of the other processes (multi-worker).
class row_exchange_span {
public:
  virtual ~row_exchange_span() = default;
  /// Fills the rows of `table` (total_rows x width elements of `elem_bytes` each) that other
  /// processes hold; this process holds rows [first_row, first_row + rows).
  virtual void gather(std::byte* table, std::size_t elem_bytes, std::size_t first_row, std::size_t rows,
                      std::size_t width, std::size_t total_rows) = 0;
  /// True in the process whose replica 0 leads the exchange (see row_exchange::leads).
  [[nodiscard]] virtual bool first_process() const noexcept = 0;
};

/// The row exchange of `replicas` host threads (one per strategy step policy).
class host_row_exchange final : public row_exchange {
public:
  /// An exchange for `replicas` replicas whose waits give up after `timeout`; `span`, when given,
  /// brings in the rows of other processes.
  host_row_exchange(std::size_t replicas, std::chrono::milliseconds timeout, row_exchange_span* span = nullptr)
      : comm_(replicas, timeout), rows_(replicas, 0), first_(replicas, 0), span_(span) {}

  /// See row_exchange::all_gather.
  const float* all_gather(std::size_t rank, const float* mine, std::size_t first_row, std::size_t rows,
                          std::size_t width, std::size_t total_rows) override {
    return gather(rank, mine, first_row, rows, width, total_rows);
  }
  /// See row_exchange::all_gather.
  const double* all_gather(std::size_t rank, const double* mine, std::size_t first_row, std::size_t rows,
                           std::size_t width, std::size_t total_rows) override {
    return gather(rank, mine, first_row, rows, width, total_rows);
  }

  /// True for replica 0 of the first process.
  [[nodiscard]] bool leads(std::size_t rank) const noexcept override {
    return rank == 0 && (!span_ || span_->first_process());
  }

  /// Has every replica call `settle(reducer, rank)` before its rows cross to other processes (the
  /// step's reducer hands the buckets it started to the communication thread first: see
  /// mpi_host_allreduce::settle); null: nothing. Set before the replicas run.
  void settle_before_crossing(void* reducer, void (*settle)(void*, std::size_t)) noexcept {
    settle_reducer_ = reducer;
    settle_ = settle;
  }

  /// True for one replica and no other process.
  [[nodiscard]] bool single() const noexcept override { return rows_.size() == 1 && !span_; }

  /// Releases replicas waiting in the exchange (they throw).
  void abort() noexcept { comm_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { comm_.reset(); }

private:
  template <class T>
  const T* gather(std::size_t rank, const T* mine, std::size_t first_row, std::size_t rows, std::size_t width,
                  std::size_t total_rows) {
    if (first_row > total_rows || rows > total_rows - first_row)
      throw shape_error("lockstep: replica " + std::to_string(rank) + " exchanges rows [" + std::to_string(first_row) +
                        ", " + std::to_string(first_row + rows) + ") of a global batch of " +
                        std::to_string(total_rows) + " rows");
    if (span_ && settle_) settle_(settle_reducer_, rank);  // the buckets started so far go first
    comm_.barrier(rank);  // every replica is done with the previous table
    const std::size_t bytes = total_rows * width * sizeof(T);
    if (rank == 0 && table_.size() < bytes) table_ = buffer<std::byte, cpus>(bytes);
    rows_[rank] = rows;
    first_[rank] = first_row;
    comm_.barrier(rank);  // the table is large enough
    if (rows) std::memcpy(table_.data() + first_row * width * sizeof(T), mine, rows * width * sizeof(T));
    comm_.barrier(rank);  // every local row is in
    std::size_t covered = 0;
    for (const std::size_t r : rows_) covered += r;
    if (span_) {
      if (rank == 0) {  // this process's rows are contiguous: the shards of its replicas
        std::size_t lo = total_rows;
        for (std::size_t r = 0; r < rows_.size(); ++r)
          if (rows_[r]) lo = std::min(lo, first_[r]);
        span_->gather(table_.data(), sizeof(T), covered ? lo : 0, covered, width, total_rows);
      }
      comm_.barrier(rank);  // the other processes' rows are in
      return reinterpret_cast<const T*>(table_.data());
    }
    if (covered != total_rows)
      throw config_error("lockstep: a layer that couples the rows of the global batch (batch_norm) saw " +
                         std::to_string(covered) + " of its " + std::to_string(total_rows) +
                         " rows on this process: the strategy does not exchange rows with other processes");
    return reinterpret_cast<const T*>(table_.data());
  }

  host_comm comm_;
  std::vector<std::size_t> rows_, first_;
  row_exchange_span* span_;
  void* settle_reducer_ = nullptr;
  void (*settle_)(void*, std::size_t) = nullptr;
  buffer<std::byte, cpus> table_;
};

}  // namespace lockstep::detail
