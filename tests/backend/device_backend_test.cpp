// The device-backend concept and its archetype: a device kind defined outside the library's
// namespace, registered through backend_traits and device_memory, with exactly the kernels the
// concept lists (naive loops) and memory the library must treat as device memory (staged through
// the context, read back with copy_to_host). Training through a run-time strategy over it proves
// that the library's replica, strategy, fit and evaluate use nothing beyond the concept.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace archetype {

/// The archetype kind: its memory is host memory in fact, but declared not host-accessible.
struct cells {
  using kind_type = cells;  ///< a kind is its own kind
};

/// Where a staged shard landed.
struct staged {
  const float* features = nullptr;       ///< features on the device
  const std::int32_t* labels = nullptr;  ///< labels on the device
  const float* targets = nullptr;        ///< targets on the device
};

/// The archetype context: activation and synchronisation counted, staging into its own buffers.
class context {
public:
  using device_kind = cells;  ///< the kind this context runs on
  void activate() const noexcept {}
  void synchronize() const noexcept {}
  staged stage_shard(const float* f, std::size_t nf, const std::int32_t* l, std::size_t nl, const float* t, std::size_t nt) {
    features_.assign(f, f + nf);
    labels_.assign(l ? l : nullptr, l ? l + nl : nullptr);
    targets_.assign(t ? t : nullptr, t ? t + nt : nullptr);
    return {features_.data(), l ? labels_.data() : nullptr, t ? targets_.data() : nullptr};
  }

private:
  std::vector<float> features_, targets_;
  std::vector<std::int32_t> labels_;
};

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

}  // namespace archetype

/// The archetype's registration: its traits ...
template <>
struct lockstep::backend_traits<archetype::cells> {
  static constexpr bool registered = true;
  using context_type = archetype::context;
  static constexpr const char* name = "cell";
  static constexpr bool ordinals_bounded = true;
  static constexpr bool replica_owns_core = false;
  static std::size_t device_count() { return 3; }
  static context_type make_context(std::size_t, const lockstep::replica_settings&) { return {}; }
};
/// ... and its memory.
template <>
struct lockstep::device_memory<archetype::cells> {
  static constexpr bool host_accessible = false;
  static void* allocate(std::size_t bytes) { return bytes ? ::operator new(bytes) : nullptr; }
  static void deallocate(void* p, std::size_t) noexcept { ::operator delete(p); }
};

namespace ls = lockstep;

static_assert(ls::device_backend<archetype::cells>);
static_assert(ls::device_backend<ls::cpus>);
static_assert(!ls::device_backend<ls::gpus>);  // not registered in a host build
static_assert(!ls::device_backend<int>);

namespace {

using net = ls::sequential<ls::dense<12, 16>, ls::tanh, ls::dropout<1, 4>, ls::dense<16, 4>>;
// The archetype's memory is host memory in fact, declared not host-accessible, so the library's
// host_allreduce refuses it; its own reducer runs the same host engine (a user-defined reducer).
struct cells_reducer : ls::host_allreduce {
  using host_allreduce::host_allreduce;
  template <class... Ds>
  static constexpr bool supports = true;
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t bucket) {
    comm_.start(replica, bucket, data, count, &ls::detail::allreduce_work<T>);
  }
};
using on_cells = ls::basic_mirrored<cells_reducer, ls::determinism::run_to_run, archetype::cells>;

auto samples() {
  std::vector<float> x(60 * 12);
  std::vector<std::int32_t> y(60);
  const ls::counter_rng rng(5, 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(rng.u32(x.size() + r) % 4);
  return ls::data::from_memory(std::move(x), 12, std::move(y)) | ls::data::batched(13);
}

template <class S>
std::pair<std::vector<float>, ls::evaluation> train_on(S& s) {
  auto m = s.template replicate<net>(ls::seed{3});
  const auto data = samples();
  (void)ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, data, {.epochs = 3, .quiet = true});
  return {m.parameters_to_host(), ls::evaluate(s, m, ls::softmax_cross_entropy{}, data)};
}

}  // namespace

TEST_CASE("device_backend archetype: fit and evaluate through a strategy over an archetype kind match the host") {
  on_cells cells(ls::device_selection::first(2));
  ls::mirrored<ls::cpus> host(ls::device_selection::first(2));
  const auto [p_cells, e_cells] = train_on(cells);
  const auto [p_host, e_host] = train_on(host);
  REQUIRE(p_cells.size() == p_host.size());
  double diff = 0;
  for (std::size_t i = 0; i < p_host.size(); ++i) diff = std::max(diff, std::abs(double(p_cells[i]) - p_host[i]));
  CHECK(diff < 1e-4);
  CHECK(e_cells.samples == 60);
  CHECK(e_cells.accuracy == doctest::Approx(e_host.accuracy));
  CHECK(e_cells.loss == doctest::Approx(e_host.loss).epsilon(1e-4));
  // The archetype's ordinals are bounded: a fourth device does not exist.
  CHECK_THROWS_AS(on_cells(ls::device_selection{0, 3}), ls::config_error);
}
