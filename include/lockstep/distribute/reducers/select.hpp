#pragma once
/// @file select.hpp
/// The default reducer of a device set, chosen at compile time: `select_reducer_t<Devices...>`
/// for a static device list and `select_kind_reducer_t<Kind>` for a run-time list of one kind.
/// This file holds the rules every build has (one device: no aggregation) and the diagnosis of a
/// set with no path; each backend adds its reducers' constrained specialisations beside them
/// (host: reducers/host.hpp; GPUs: the CUDA reducers).

#include <cstddef>

#include <lockstep/backend/context.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/single_device.hpp>

namespace lockstep {

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
  static constexpr bool gpu_backend = backend_traits<typename dependent_type<gpus, Devices...>::type>::registered;
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

/// The default reducer of a device set. This primary template is chosen only when no path exists;
/// its message names the one cause that applies.
template <class... Devices>
struct select_reducer {
  using why = detail::no_reducer_diagnosis<Devices...>;  ///< the diagnosis
  static_assert(!why::mixed, "lockstep: no reducer for this device set: cpu<I> and gpu<I> devices cannot share one "
                             "strategy; use one strategy per device kind");
  static_assert(!(why::all_gpu && !why::gpu_backend),
                "lockstep: no reducer for this device set: gpu<I> devices need the CUDA backend; #include "
                "<lockstep/backend/cuda.hpp> in a .cu file compiled by nvcc and link lockstep::cuda");
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
  using type = void;  ///< no reducer
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
/// that kind). This primary template is chosen only when the kind's backend offers none.
template <class Kind>
struct select_kind_reducer {
  static_assert(!is_gpu_v<Kind>, "lockstep: no reducer for gpu devices; include <lockstep/backend/cuda.hpp> (a .cu "
                                 "file compiled by nvcc) and link lockstep::cuda");
  static_assert(is_gpu_v<Kind>, "lockstep: no default reducer for this device kind; its backend must specialise "
                                "lockstep::select_kind_reducer<Kind>, or name a reducer with basic_mirrored<Reducer, ...>");
  using type = void;  ///< no reducer
};

/// Shorthand for select_kind_reducer<Kind>::type.
template <class Kind>
using select_kind_reducer_t = typename select_kind_reducer<Kind>::type;

}  // namespace lockstep
