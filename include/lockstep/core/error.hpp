#pragma once
/// @file error.hpp
/// The lockstep::error hierarchy: every failure the library reports is one of these.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <system_error>

namespace lockstep {

/// Base of every exception lockstep throws; catch this to catch them all.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Bad input data: a corrupt, truncated or malformed file or record (message names file and offset or line).
class data_error : public error {
public:
  using error::error;
};

/// A run-time shape disagreement (batch width, label count, buffer length).
class shape_error : public error {
public:
  using error::error;
};

/// A bad option or configuration value (message names the option).
class config_error : public error {
public:
  using error::error;
};

/// A failure reported by a device library (CUDA, cuBLAS, NCCL): carries the call, file:line and message.
class device_error : public error {
public:
  using error::error;
};

/// A collective or replica did not arrive in time (message names the replica and bucket).
class timeout_error : public error {
public:
  using error::error;
};

/// A replica failed: the strategy forwards the first failure to the caller as a replica_error
/// naming the replica (and the training step), with the original exception nested inside it
/// (`std::rethrow_if_nested(e)` rethrows it, keeping its type).
class replica_error : public error {
public:
  /// Sentinel of step(): the failure happened outside a training step.
  static constexpr std::uint64_t no_step = ~std::uint64_t{0};

  /// A failure of replica `replica` during step `step` (no_step when not in a training step).
  replica_error(const std::string& what, std::size_t replica, std::uint64_t step = no_step)
      : error(what), replica_(replica), step_(step) {}
  /// A failure without a replica index (collective bookkeeping).
  explicit replica_error(const std::string& what) : error(what) {}

  /// The replica that failed.
  [[nodiscard]] std::size_t replica() const noexcept { return replica_; }
  /// The training step (the model's update counter before the step), or no_step.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }

private:
  std::size_t replica_ = 0;
  std::uint64_t step_ = no_step;
};

/// Training met numbers it cannot use: a reduced gradient that is not finite (the non-finite
/// guard's raise policy, or too many skipped updates in a row). The message names the update, the
/// first non-finite layer and the replica and worker whose shard produced it, where known.
class numerics_error : public error {
public:
  /// A failure at update `step` (the model's update counter before it).
  numerics_error(const std::string& what, std::uint64_t step) : error(what), step_(step) {}
  /// The update (the model's update counter before it).
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }

private:
  std::uint64_t step_ = 0;
};

/// A checkpoint that is corrupt, truncated, of another version or of another model.
class checkpoint_error : public error {
public:
  using error::error;
};

/// The operating system's reason for error number `errnum` (for example "No such file or
/// directory"), for messages that say why a file could not be opened or read.
inline std::string os_reason(int errnum) { return std::generic_category().message(errnum); }

namespace detail {
/// Whether v is finite and >= 0 (false for NaN): the range of learning rates, their factors and
/// decays, which fit, the optimisers, the schedules and the checkpoint reader all check.
[[nodiscard]] inline bool finite_nonnegative(double v) noexcept { return v >= 0 && std::isfinite(v); }

/// `v` in messages, with 9 significant digits ("-1e-08", not std::to_string's "-0.000000",
/// which would make a refused value look valid).
[[nodiscard]] inline std::string option_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

/// Throws config_error "<who>: <what> must be <range>, got <value>" unless `ok` (the range
/// checks of options: optimisers' hyper-parameters, update_recipe).
inline void require_option(const char* who, const char* what, double value, bool ok, const char* range) {
  if (!ok) throw config_error(std::string(who) + ": " + what + " must be " + range + ", got " + option_value(value));
}
}  // namespace detail

}  // namespace lockstep
