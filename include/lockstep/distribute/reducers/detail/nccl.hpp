#pragma once
/// @file nccl.hpp
/// Internal: what every NCCL reducer shares, written once — NCCL status codes as
/// `device_error`s, the NCCL element type of T, the version of the NCCL library loaded at run
/// time, and stopping and tearing down a set of communicators (revoke, abort, finalize +
/// destroy). Host code: compiles with g++ where NCCL's header is present (LOCKSTEP_HAS_NCCL).

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/collective_ids.hpp>

namespace lockstep::detail {

/// Throws device_error when an NCCL call failed ("lockstep: NCCL call `<call>` failed at <file>:<line>: <message>").
inline void check_nccl(ncclResult_t status, const char* call,
                       const std::source_location& where = std::source_location::current()) {
  if (status == ncclSuccess) return;
  throw device_error(backend::detail::device_failure_message("NCCL", call, ncclGetErrorString(status), where));
}

/// The NCCL element type of T.
template <class T>
constexpr ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return ncclUint8;
  else static_assert(std::is_same_v<T, void>, "lockstep: no NCCL type for this element type");
}

/// The version code of the NCCL library loaded at run time (as NCCL_VERSION(major, minor, patch);
/// 0 when NCCL cannot say). It may differ from the headers' NCCL_VERSION_CODE: a program built
/// against one NCCL may load another.
inline int nccl_runtime_version() noexcept {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

/// ncclCommRevoke's signature (NCCL 2.28 and newer).
using nccl_revoke_fn = ncclResult_t (*)(ncclComm_t, int);

/// ncclCommRevoke when the NCCL loaded at run time has it (`runtime_version` >= 2.28 and the
/// symbol is found), else null. Looked up by name, so a program built against NCCL 2.28 headers
/// still loads and runs with an older NCCL library (it then aborts instead of revoking).
inline nccl_revoke_fn nccl_revoke_function(int runtime_version = nccl_runtime_version()) noexcept {
  constexpr int first = 22800;  // NCCL_VERSION(2, 28, 0)
  if (runtime_version < first) return nullptr;
  return reinterpret_cast<nccl_revoke_fn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
}

/// Aborts (and frees) every communicator of `comms` and nulls it. No thread may be inside an
/// NCCL call on any of them.
inline void nccl_abort_all(std::vector<ncclComm_t>& comms) noexcept {
  for (auto& c : comms)
    if (c) {
      (void)ncclCommAbort(c);
      c = nullptr;
    }
}

/// Stops every communicator of `comms` after a failure: revokes, with `revoke` from
/// nccl_revoke_function, each one that is ready (its in-flight work stops; the handle stays valid
/// and is aborted later), and aborts and nulls the others: all of them when `revoke` is null, and
/// any still being set up or holding an error (only an abort stops a non-blocking set-up). Null
/// entries are skipped. No thread may be inside an NCCL call on any of them.
inline void nccl_stop_all(std::vector<ncclComm_t>& comms, nccl_revoke_fn revoke) noexcept {
  for (auto& c : comms) {
    if (!c) continue;
    ncclResult_t state = ncclInProgress;
    if (revoke && ncclCommGetAsyncError(c, &state) == ncclSuccess && state == ncclSuccess) {
      (void)revoke(c, 0);  // revokeFlags: NCCL_REVOKE_DEFAULT
    } else {
      (void)ncclCommAbort(c);
      c = nullptr;
    }
  }
}

/// The least time NCCL's set-up of a communicator and a broadcast (the first collective, where
/// NCCL connects the peers) may take, whatever strategy_options::timeout says: set-up
/// legitimately takes seconds, a step's collective far less.
inline constexpr std::chrono::milliseconds nccl_setup_timeout{60'000};

/// How long an NCCL call of collective `id` may take before the reducer gives up: `timeout`, and
/// at least nccl_setup_timeout for the set-up and broadcasts.
inline std::chrono::milliseconds nccl_limit(std::size_t id, std::chrono::milliseconds timeout) noexcept {
  return id == collective_ids::setup || id == collective_ids::broadcast ? std::max(timeout, nccl_setup_timeout)
                                                                        : timeout;
}

/// Tears down the healthy communicators of `comms` (null entries are skipped) and nulls them:
/// finalizes them together inside one group (so finalizing one cannot wait for a peer this very
/// thread has yet to finalize), polls each until it is quiescent for at most `timeout` (a peer
/// that is gone cannot take part), then destroys them. Returns true when they were finalized and
/// destroyed; otherwise aborts them all and returns false. No thread may be inside an NCCL call
/// on any of them.
inline bool nccl_finalize_destroy(std::vector<ncclComm_t>& comms, std::chrono::milliseconds timeout) noexcept {
  bool any = false;
  for (ncclComm_t c : comms) any = any || c != nullptr;
  if (!any) return true;
  bool ok = ncclGroupStart() == ncclSuccess;
  if (ok) {
    for (ncclComm_t c : comms)
      if (c) {
        const ncclResult_t s = ncclCommFinalize(c);
        ok = ok && (s == ncclSuccess || s == ncclInProgress);
      }
    const ncclResult_t end = ncclGroupEnd();
    ok = ok && (end == ncclSuccess || end == ncclInProgress);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (ncclComm_t c : comms) {
    if (!c) continue;
    ncclResult_t state = ncclInProgress;
    while (ok && state == ncclInProgress) {
      if (ncclCommGetAsyncError(c, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclInProgress) {
        if (std::chrono::steady_clock::now() > deadline) ok = false;
        else std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    ok = ok && state == ncclSuccess;
  }
  if (!ok) {
    nccl_abort_all(comms);
    return false;
  }
  for (auto& c : comms)
    if (c) {
      (void)ncclCommDestroy(c);
      c = nullptr;
    }
  return true;
}

}  // namespace lockstep::detail

/// Runs an NCCL call and throws lockstep::device_error (call text, file:line, message) on failure.
#define LOCKSTEP_NCCL_CHECK(call) ::lockstep::detail::check_nccl((call), #call, std::source_location::current())
