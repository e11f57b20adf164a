// Test inputs shared by the test binaries: reproducible random vectors and the element accessor
// of a row-major matrix seen through a transposition, as the GEMM tests on every device use them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/random.hpp>

namespace test_support {

/// n values uniform in [lo, hi), drawn from counter stream (key, stream): the same values on
/// every run and machine.
template <class T = float>
std::vector<T> random_vector(std::size_t n, std::uint64_t stream, T lo = T(-1), T hi = T(1),
                             std::uint64_t key = 1234) {
  std::vector<T> v(n);
  const lockstep::counter_rng rng(key, stream);
  for (std::size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * static_cast<T>(rng.uniform_double(i));
  return v;
}

/// op(X)[r][c] of the row-major matrix `x` with leading dimension `ld` (op: transposed or not).
template <class T>
T op_at(const std::vector<T>& x, std::size_t ld, lockstep::backend::trans t, std::size_t r, std::size_t c) {
  return t == lockstep::backend::trans::no ? x[r * ld + c] : x[c * ld + r];
}

}  // namespace test_support
