#pragma once
/// @file error.hpp
/// The lockstep::error hierarchy: every failure the library reports is one of these.

#include <stdexcept>
#include <string>

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

/// A replica's step failed; the strategy forwards the first failure to the caller.
class replica_error : public error {
public:
  using error::error;
};

/// A checkpoint that is corrupt, truncated, of another version or of another model.
class checkpoint_error : public error {
public:
  using error::error;
};

}  // namespace lockstep
