#pragma once
/// @file error.hpp
/// Turns CUDA runtime and cuBLAS status codes into `lockstep::device_error` exceptions that name
/// the call, the file:line of the call site and the library's own message.

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <source_location>
#include <string>

#include <lockstep/core/error.hpp>

namespace lockstep::backend {

namespace detail {
/// "lockstep: <library> call `<call>` failed at <file>:<line>: <message>".
inline std::string device_failure_message(const char* library, const char* call, const std::string& message,
                                          const std::source_location& where) {
  return std::string("lockstep: ") + library + " call `" + call + "` failed at " + where.file_name() + ":" +
         std::to_string(where.line()) + ": " + message;
}
}  // namespace detail

/// Throws device_error when a CUDA runtime call did not return cudaSuccess (the sticky error is
/// left for the caller; the message carries the call, its file:line and CUDA's text).
inline void check_cuda(cudaError_t status, const char* call,
                       const std::source_location& where = std::source_location::current()) {
  if (status == cudaSuccess) return;
  throw device_error(detail::device_failure_message(
      "CUDA", call, std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status), where));
}

/// Throws device_error when a cuBLAS call did not return CUBLAS_STATUS_SUCCESS.
inline void check_cublas(cublasStatus_t status, const char* call,
                         const std::source_location& where = std::source_location::current()) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw device_error(detail::device_failure_message(
      "cuBLAS", call, std::string(cublasGetStatusName(status)) + ": " + cublasGetStatusString(status), where));
}

}  // namespace lockstep::backend

/// Runs a CUDA runtime call and throws lockstep::device_error (call text, file:line, message) on failure.
#define LOCKSTEP_CUDA_CHECK(call) ::lockstep::backend::check_cuda((call), #call, std::source_location::current())

/// Runs a cuBLAS call and throws lockstep::device_error (call text, file:line, message) on failure.
#define LOCKSTEP_CUBLAS_CHECK(call) ::lockstep::backend::check_cublas((call), #call, std::source_location::current())
