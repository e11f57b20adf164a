#pragma once
/// @file host_aggregation.hpp
/// Internal: the hook through which a backend lets `reduce_to_one_device<cpu<I>>` aggregate the
/// buckets of its replicas in host memory (GPU replicas: through pinned staging, specialised by
/// the CUDA reducers). Host builds see only the primary templates.

#include <cstddef>

namespace lockstep::detail {

/// Host memory in which a backend stages device data for reduce_to_one_device<cpu<I>>
/// (type-erased, so host builds need no backend headers).
class host_staging {
public:
  virtual ~host_staging() = default;
  /// The memory.
  [[nodiscard]] virtual void* data() noexcept = 0;
  /// Its size in bytes.
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
};

/// How reduce_to_one_device<cpu<I>> serves replicas whose context is Ctx. This primary template
/// is host memory (the shared-memory engine); a backend specialises it for its context type with
/// `enabled = true` and static `start`, `wait` and `broadcast` that stage through host_staging.
template <class Ctx>
struct host_aggregation {
  static constexpr bool enabled = false;  ///< no backend path: the data is host memory
};

/// Whether replicas on device Dv may aggregate on the host (a backend specialises it to true).
template <class Dv>
inline constexpr bool host_aggregation_serves = false;

}  // namespace lockstep::detail
