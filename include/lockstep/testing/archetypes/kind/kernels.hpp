#pragma once
/// @file kernels.hpp (testing/archetypes/kind)
/// The kernels of the archetype kind.
/// The archetype device kind is built the way docs/architecture.md ("Adding a device kind") says
/// a new kind is added, in these files: context.hpp (the kind tag and its execution context),
/// kernels.hpp (the kernels layers, losses and optimisers call, found by argument-dependent
/// lookup on the context), memory.hpp (its memory), backend.hpp (its registration) and
/// reducer.hpp (its reducer and default selection); ../kind.hpp includes them all. Its memory is
/// host memory in fact, declared not host-accessible, so the library must treat it as device
/// memory; its kernels are naive loops. The backend suite (lockstep/testing/backend.hpp) checks it.

#include <cstddef>
#include <cstdint>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/backend/softmax_xent.hpp>
#include <lockstep/testing/archetypes/kind/context.hpp>

namespace lockstep_archetypes {

template <class T>
void gemm(const context&, lockstep::backend::trans ta, lockstep::backend::trans tb, std::size_t m, std::size_t n,
          std::size_t k, T alpha, const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  const bool at = ta == lockstep::backend::trans::yes, bt = tb == lockstep::backend::trans::yes;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      T acc = 0;
      for (std::size_t p = 0; p < k; ++p) acc += (at ? a[p * lda + i] : a[i * lda + p]) * (bt ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = alpha * acc + (beta == T(0) ? T(0) : beta * c[i * ldc + j]);
    }
}
template <class F>
void for_each_index(const context&, std::size_t n, const F& f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}
template <class T>
void fill(const context&, T* p, std::size_t n, T v) {
  for (std::size_t i = 0; i < n; ++i) p[i] = v;
}
template <class T>
void copy(const context&, T* d, const T* s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
}
template <class T>
void copy_from_host(const context& c, T* d, const T* s, std::size_t n) {
  copy(c, d, s, n);
}
template <class T>
void copy_to_host(const context& c, T* d, const T* s, std::size_t n) {
  copy(c, d, s, n);
}
template <class T>
void broadcast_rows(const context&, T* y, const T* v, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < cols; ++j) y[r * cols + j] = v[j];
}
template <class T>
void column_sums(const context&, const T* x, std::size_t rows, std::size_t cols, T* out) {
  for (std::size_t j = 0; j < cols; ++j) out[j] = 0;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < cols; ++j) out[j] += x[r * cols + j];
}
template <class T>
double sum(const context&, const T* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
  return s;
}
template <class T>
void scale(const context&, T* x, std::size_t n, T a) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= a;
}
// The generic softmax cross-entropy, whose totals go to the readback page while the context
// defers (zeros are returned then, as a device that does not wait returns them).
template <class T>
lockstep::backend::softmax_xent_totals softmax_xent(const context& c, const T* z, const std::int32_t* labels,
                                                    std::size_t rows, std::size_t cols, T* grad, T* scratch) {
  const lockstep::backend::softmax_xent_totals t = lockstep::backend::softmax_xent<context, T>(c, z, labels, rows, cols, grad, scratch);
  if (!c.defers_readback()) return t;
  c.defer_totals(t.loss, t.hits);
  return {};
}

}  // namespace lockstep_archetypes
