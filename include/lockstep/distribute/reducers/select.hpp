#pragma once
/// @file select.hpp
/// The default reducer of a device set, chosen at compile time: `select_reducer_t<Devices...>`
/// for a static device list and `select_kind_reducer_t<Kind>` for a run-time list of one kind.
/// This file holds the rules every build has (one device: no aggregation) and the diagnosis of a
/// set with no path; each backend adds its reducers' constrained specialisations beside them
/// (host: reducers/host.hpp; GPUs: reducers/gpu_selection.cuh).

#include <cstddef>
#include <type_traits>

#include <lockstep/backend/context.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/single_device.hpp>

namespace lockstep {

/// True when the reducers and default selections of device kind Kind are defined in this
/// translation unit: a backend's reducer headers specialise it (the GPU kind's:
/// <lockstep/cuda.hpp>), so the diagnosis can tell a missing include from a device set that has
/// no path.
template <class Kind>
struct default_reducers_for : std::false_type {};

namespace detail {
/// T, as a type that depends on Ts (so a backend may still specialise templates of T before use).
template <class T, class... Ts>
struct dependent_type {
  using type = T;  ///< T
};

/// Why Devices... (several of them) have no default reducer; each diagnosis names one cause.
template <class... Devices>
struct no_reducer_diagnosis {
  static constexpr bool all_cpu = (is_cpu_v<Devices> && ...);
  static constexpr bool all_gpu = (is_gpu_v<Devices> && ...);
  static constexpr bool mixed = !all_cpu && !all_gpu && ((is_cpu_v<Devices> || is_gpu_v<Devices>) && ...);
  static constexpr bool gpu_backend = backend_traits<typename dependent_type<gpus, Devices...>::type>::registered &&
                                      default_reducers_for<typename dependent_type<gpus, Devices...>::type>::value;
  static constexpr bool distinct_gpus = [] {
    if constexpr (!all_gpu) {
      return false;
    } else {
      constexpr std::size_t ord[] = {static_cast<std::size_t>(Devices::ordinal)...};
      for (std::size_t i = 0; i < sizeof...(Devices); ++i)
        for (std::size_t j = i + 1; j < sizeof...(Devices); ++j)
          if (ord[i] == ord[j]) return false;
      return true;
    }
  }();
#if defined(LOCKSTEP_HAS_NCCL)
  static constexpr bool nccl = true;
#else
  static constexpr bool nccl = false;
#endif
};
}  // namespace detail

/// What select_reducer names for a device set with no reducer, after its one error: a reducer in
/// form only (every call does nothing), so that the strategy built on it adds no error of its
/// own (every check of the strategy is skipped for it: is_no_reducer_v).
template <class... Devices>
struct no_reducer : single_device_reducer {
  /// Claims every device set (the error was already given).
  template <class... Ds>
  static constexpr bool supports = true;
  /// Ignores the configuration (every call does nothing, as single_device_reducer's).
  explicit no_reducer(const reducer_config& c = {}) noexcept : single_device_reducer(c) {}
};

/// True for no_reducer<...>: the reducer of a device set whose error select_reducer already gave.
template <class R>
inline constexpr bool is_no_reducer_v = false;
/// no_reducer<...> is a no_reducer.
template <class... Ds>
inline constexpr bool is_no_reducer_v<no_reducer<Ds...>> = true;

namespace detail {
/// Gives the one error of a device set with no reducer: the message of the cause that applies.
/// (In a function, so that the failed assertion leaves select_reducer itself intact and names
/// no_reducer, and neither compiler adds an error of its own.)
template <class... Devices>
constexpr bool diagnose_no_reducer() {
  using why = no_reducer_diagnosis<Devices...>;
  static_assert(!why::mixed, "lockstep: no reducer for this device set: cpu<I> and gpu<I> devices cannot share one "
                             "strategy; use one strategy per device kind");
  static_assert(!(why::all_gpu && !why::gpu_backend),
                "lockstep: no reducer for this device set: gpu<I> devices need the CUDA backend and its reducers; "
                "#include <lockstep/cuda.hpp> in a .cu file compiled by nvcc and link lockstep::cuda");
  static_assert(!(why::all_gpu && why::gpu_backend && why::distinct_gpus && !why::nccl),
                "lockstep: no reducer for this device set: several distinct gpu<I> need NCCL; install NCCL where "
                "CMake finds it (cmake/FindNCCL.cmake, NCCL_ROOT) with LOCKSTEP_CUDA=AUTO or ON and link lockstep::nccl "
                "(which defines LOCKSTEP_HAS_NCCL)");
  static_assert(!(why::all_gpu && why::gpu_backend && !why::distinct_gpus),
                "lockstep: no reducer for this device set: a gpu<I> listed more than once next to other GPUs has no "
                "default reducer (all on one GPU, or all distinct, have one); name a reducer with "
                "basic_mirrored<Reducer, ...>");
  static_assert(why::mixed || why::all_gpu,
                "lockstep: no reducer for this device set: its device kind's backend offers no default reducer; "
                "specialise lockstep::select_reducer for it, or name a reducer with basic_mirrored<Reducer, ...>");
  return true;
}

/// Gives the one error of a run-time strategy's kind with no default reducer.
template <class Kind>
constexpr bool diagnose_no_kind_reducer() {
  static_assert(!is_gpu_v<Kind>, "lockstep: no reducer for gpu devices; include <lockstep/cuda.hpp> (a .cu file "
                                 "compiled by nvcc) and link lockstep::cuda");
  static_assert(is_gpu_v<Kind>, "lockstep: no default reducer for this device kind; its backend must specialise "
                                "lockstep::select_kind_reducer<Kind>, or name a reducer with basic_mirrored<Reducer, ...>");
  return true;
}
}  // namespace detail

/// The default reducer of a device set. This primary template is chosen only when no path exists:
/// it gives one error naming the cause that applies, and names no_reducer, which silences every
/// error that would follow.
template <class... Devices>
struct select_reducer {
  using why = detail::no_reducer_diagnosis<Devices...>;  ///< the diagnosis
  static constexpr bool diagnosed = detail::diagnose_no_reducer<Devices...>();  ///< the one error
  using type = std::conditional_t<diagnosed, no_reducer<Devices...>, no_reducer<Devices...>>;  ///< no reducer
};

/// One device needs no aggregation.
template <class Device>
struct select_reducer<Device> {
  using type = single_device_reducer;  ///< the no-op reducer
};

/// Shorthand for select_reducer<Devices...>::type.
template <class... Devices>
using select_reducer_t = typename select_reducer<Devices...>::type;

/// The default reducer of a run-time strategy over device kind Kind (any number of replicas of
/// that kind). This primary template is chosen only when the kind's backend offers none: one
/// error, and no_reducer.
template <class Kind>
struct select_kind_reducer {
  static constexpr bool diagnosed = detail::diagnose_no_kind_reducer<Kind>();  ///< the one error
  using type = std::conditional_t<diagnosed, no_reducer<Kind>, no_reducer<Kind>>;  ///< no reducer
};

/// Shorthand for select_kind_reducer<Kind>::type.
template <class Kind>
using select_kind_reducer_t = typename select_kind_reducer<Kind>::type;

}  // namespace lockstep
