// The host GEMM of either LOCKSTEP_HOST_GEMM backend (CBLAS or oneDNN) against a naive product in
// double: empty, unit, prime and blocked shapes, every transposition, padded leading dimensions,
// alpha and beta (beta = 0 over a NaN-filled C), repeated calls on other buffers, and no heap
// allocation once a shape has been seen. This is the one file of test_backend that counts
// allocations (it replaces operator new for the whole binary).
#define LOCKSTEP_TESTING_COUNT_ALLOCATIONS
#include <lockstep/testing/allocations.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/core/random.hpp>

#include "support/random.hpp"

namespace ls = lockstep;
using ls::backend::trans;

namespace {
template <class T>
std::vector<T> random_matrix(std::size_t n, std::uint64_t stream) {
  return test_support::random_vector<T>(n, stream, T(-1), T(1), 77);
}

// op(X)[r][c], in double.
template <class T>
double at(const std::vector<T>& x, std::size_t ld, trans t, std::size_t r, std::size_t c) {
  return static_cast<double>(test_support::op_at(x, ld, t, r, c));
}

struct gemm_case {
  trans ta, tb;
  std::size_t m, n, k, pad;  // pad: extra elements per row of A, B and C beyond the minimum
  double alpha, beta;
};

std::string describe(const gemm_case& g) {
  return "m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
         " ta=" + (g.ta == trans::yes ? "T" : "N") + " tb=" + (g.tb == trans::yes ? "T" : "N") +
         " pad=" + std::to_string(g.pad) + " alpha=" + std::to_string(g.alpha) + " beta=" + std::to_string(g.beta);
}

// The operands of one GEMM in row-major storage, C's padding filled with a sentinel.
template <class T>
struct operands {
  std::size_t lda, ldb, ldc;
  std::vector<T> a, b, c;

  operands(const gemm_case& g, std::uint64_t seed) {
    const std::size_t a_rows = g.ta == trans::no ? g.m : g.k, a_cols = g.ta == trans::no ? g.k : g.m;
    const std::size_t b_rows = g.tb == trans::no ? g.k : g.n, b_cols = g.tb == trans::no ? g.n : g.k;
    lda = a_cols + g.pad + (a_cols == 0 ? 1 : 0);
    ldb = b_cols + g.pad + (b_cols == 0 ? 1 : 0);
    ldc = g.n + g.pad + (g.n == 0 ? 1 : 0);
    a = random_matrix<T>(a_rows * lda, 3 * seed);
    b = random_matrix<T>(b_rows * ldb, 3 * seed + 1);
    c = random_matrix<T>(g.m * ldc, 3 * seed + 2);
    for (std::size_t i = 0; i < g.m; ++i)
      for (std::size_t j = g.n; j < ldc; ++j) c[i * ldc + j] = T(-99);
    if (g.beta == 0)  // beta = 0 must not read C
      for (std::size_t i = 0; i < g.m; ++i)
        for (std::size_t j = 0; j < g.n; ++j) c[i * ldc + j] = std::numeric_limits<T>::quiet_NaN();
  }
};

// Runs one GEMM and checks every element of C, or with `samples` > 0 about that many spread over
// it, against a double product (and that C's padding is untouched, everywhere).
template <class T>
void check_gemm(const ls::host_context& ctx, const gemm_case& g, operands<T>& o, std::size_t samples = 0) {
  CAPTURE(describe(g));
  const std::vector<T> before = o.c;
  gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, static_cast<T>(g.alpha), o.a.data(), o.lda, o.b.data(), o.ldb,
       static_cast<T>(g.beta), o.c.data(), o.ldc);
  const double eps = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  const std::size_t total = g.m * g.n;
  const std::size_t step = samples == 0 || samples >= total ? 1 : total / samples + 1;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.m; ++i) {
    for (std::size_t j = 0; j < o.ldc; ++j) {
      const T got = o.c[i * o.ldc + j];
      if (j >= g.n) {
        if (got != T(-99)) ++bad;
        continue;
      }
      if ((i * g.n + j) % step != 0) continue;
      double ref = 0, magnitude = 0;
      for (std::size_t p = 0; p < g.k; ++p) {
        const double term = at(o.a, o.lda, g.ta, i, p) * at(o.b, o.ldb, g.tb, p, j);
        ref += term;
        magnitude += std::abs(term);
      }
      ref *= g.alpha;
      magnitude *= std::abs(g.alpha);
      if (g.beta != 0) {
        const double old = static_cast<double>(before[i * o.ldc + j]);
        ref += g.beta * old;
        magnitude += std::abs(g.beta * old);
      }
      const double tol = 4 * eps * (static_cast<double>(g.k) + 2) * (magnitude + 1e-30);
      if (!(std::abs(static_cast<double>(got) - ref) <= tol)) {
        if (bad == 0) {
          CAPTURE(i);
          CAPTURE(j);
          CAPTURE(static_cast<double>(got));
          CAPTURE(ref);
          CHECK(std::abs(static_cast<double>(got) - ref) <= tol);
        }
        ++bad;
      }
    }
  }
  CHECK(bad == 0);
}

constexpr std::pair<double, double> alpha_beta[] = {{1, 0}, {1, 1}, {0.5, 0.25}, {-2, 0}, {1, -1}, {0, 0.5}, {3, 1}};
constexpr trans transpositions[] = {trans::no, trans::yes};
}  // namespace

TEST_CASE("host_gemm_name names the configured kernels") {
  const std::string name = ls::host_gemm_name();
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  CHECK(name.rfind("oneDNN ", 0) == 0);
  CHECK(name.find('(') != std::string::npos);
  // Under backend/onednn_capped_isa, ONEDNN_MAX_CPU_ISA caps oneDNN's kernels and this variable
  // names the instruction set the name must then show (so the capped run is known to be capped).
  const char* isa = std::getenv("LOCKSTEP_TEST_ONEDNN_ISA");
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!__builtin_cpu_supports("avx2")) isa = nullptr;  // below the cap already: nothing to check
#endif
  if (isa) {
    INFO("host GEMM: ", name);
    CHECK(name.ends_with("(" + std::string(isa) + ")"));
  }
#else
  CHECK(name == "OpenBLAS " + ls::blas_core_name());
#endif
}

TEST_CASE_TEMPLATE("gemm matches a double-precision product over shapes, transpositions, strides, alpha and beta", T,
                   float, double) {
  const ls::host_context ctx(1);
  ctx.activate();
  std::uint64_t seed = 1;
  std::size_t combo = 0;
  for (const std::size_t m : {0, 1, 2, 7, 33})
    for (const std::size_t n : {0, 1, 5, 16, 31})
      for (const std::size_t k : {0, 1, 3, 17, 64})
        for (const trans ta : transpositions)
          for (const trans tb : transpositions)
            for (const std::size_t pad : {0, 3}) {
              const auto [alpha, beta] = alpha_beta[combo++ % std::size(alpha_beta)];
              const gemm_case g{ta, tb, m, n, k, pad, alpha, beta};
              operands<T> o(g, seed++);
              check_gemm(ctx, g, o);
            }
  // Shapes large enough for the kernels' blocking, with prime and uneven sizes.
  for (const auto& [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{128, 97, 257},
                                {61, 300, 129},
                                {256, 10, 512},
                                {3, 515, 67}})
    for (const trans ta : transpositions)
      for (const trans tb : transpositions)
        for (const auto& [alpha, beta] : {std::pair{1.0, 0.0}, std::pair{1.0, 1.0}, std::pair{0.5, 0.25}}) {
          const gemm_case g{ta, tb, m, n, k, 5, alpha, beta};
          operands<T> o(g, seed++);
          check_gemm(ctx, g, o);
        }
}

TEST_CASE_TEMPLATE("gemm reuses a shape on other buffers and other alpha and beta values", T, float, double) {
  ls::host_context ctx(1);
  ctx.activate();
  for (const trans ta : transpositions)
    for (const trans tb : transpositions) {
      std::uint64_t seed = 1000;
      for (int round = 0; round < 3; ++round)
        for (const auto& [alpha, beta] :
             {std::pair{1.0, 0.0}, std::pair{1.0, 1.0}, std::pair{-0.5, 1.0}, std::pair{2.0, 0.0}}) {
          const gemm_case g{ta, tb, 19, 23, 29, 2, alpha, beta};
          operands<T> o(g, seed++);  // fresh buffers every call: the cached shape must follow the pointers
          check_gemm(ctx, g, o);
        }
    }
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  if constexpr (std::is_same_v<T, float>) {
    // One primitive per (transpositions, alpha == 1, beta != 0): 4 x 4 here, whatever the pointers and values.
    CHECK(ctx.gemm_cache().primitives() == 16);
    CHECK(!ctx.gemm_cache().last_implementation().empty());
    // A moved context keeps its primitives; a copy starts with none of its own.
    const ls::host_context copy = ctx;
    CHECK(copy.gemm_cache().primitives() == 0);
    const ls::host_context moved = std::move(ctx);
    CHECK(moved.gemm_cache().primitives() == 16);
  }
#endif
}

#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
TEST_CASE("onednn gemm: at most primitives_kept shapes are kept, and an evicted shape comes back with the same bits") {
  // A context predicting on ever-changing batch sizes (m = the rows): its primitives stay bounded.
  ls::host_context ctx(1);
  ctx.activate();
  constexpr std::size_t kept = ls::backend::detail::onednn_gemm_cache::primitives_kept;
  const gemm_case first{trans::no, trans::no, 1, 7, 5, 0, 1.0, 0.0};
  operands<float> o1(first, 1);
  check_gemm(ctx, first, o1);
  const std::vector<float> first_c = o1.c;
  for (std::size_t m = 2; m <= kept + 9; ++m) {
    const gemm_case g{trans::no, trans::no, m, 7, 5, 0, 1.0, 0.0};
    operands<float> o(g, m);
    gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f, o.c.data(), o.ldc);
    REQUIRE(ctx.gemm_cache().primitives() <= kept);
  }
  CHECK(ctx.gemm_cache().primitives() == kept);
  operands<float> again(first, 1);  // m = 1 was the least recently used: evicted, made again
  check_gemm(ctx, first, again);
  CHECK(again.c == first_c);
}
#endif

namespace {
using gemm_shape = std::tuple<std::size_t, std::size_t, std::size_t>;

/// Runs each shape (m, n, k) with every transposition and beta 0 and 1 on `ctx` three times, on
/// two sets of buffers, and checks that the second and third calls allocate nothing of lockstep's
/// (the first may set things up) and that oneDNN's own blocks stay the same call after call.
template <class T>
void check_repeats_allocate_nothing(const ls::host_context& ctx, std::initializer_list<gemm_shape> shapes) {
  ctx.activate();
  for (const trans ta : transpositions)
    for (const trans tb : transpositions)
      for (const auto& [m, n, k] : shapes)
        for (const double beta : {0.0, 1.0}) {
          const gemm_case g{ta, tb, m, n, k, 0, 1.0, beta};
          CAPTURE(describe(g));
          operands<T> o(g, 5), other(g, 6);
          const auto run = [&](operands<T>& x) {
            gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, T(1), x.a.data(), x.lda, x.b.data(), x.ldb, static_cast<T>(g.beta),
                 x.c.data(), x.ldc);
          };
          run(o);  // the first call of a shape may set things up (primitives, conversion buffers)
          const ls::testing::allocation_window second;
          run(other);
          const std::size_t onednn_second = second.onednn_count();
          CHECK(second.count() == 0);
          const ls::testing::allocation_window third;
          run(o);
          CHECK(third.count() == 0);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
          // oneDNN 2.x allocates a few small blocks inside every primitive execution (its
          // argument map); the number stays the same call after call.
          CHECK(third.onednn_count() == onednn_second);
          CHECK(onednn_second <= 16);
#else
          CHECK(onednn_second == 0);
          CHECK(third.onednn_count() == 0);
#endif
        }
}
}  // namespace

TEST_CASE_TEMPLATE("a repeated gemm shape allocates nothing", T, float, double) {
  check_repeats_allocate_nothing<T>(ls::host_context(1), {{256, 512, 784}, {256, 10, 512}, {13, 7, 5}});
}

TEST_CASE("a repeated bf16 or fp16 gemm shape allocates nothing (native kernels or emulation)") {
  for (const auto p : {ls::compute_precision::bf16, ls::compute_precision::fp16}) {
    ls::host_context ctx(1, true, p);
    ctx.set_gemm_precision(p);
    check_repeats_allocate_nothing<float>(ctx, {{64, 512, 784}, {13, 7, 5}});
  }
}

#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
namespace {
/// The GEMM of g on ctx (a fresh primitive of its shape), checked by check_gemm (`samples`
/// elements of C, all when 0) on the operands as the kernels read them: rounded to bf16 first
/// when `bf16`. Returns the implementation oneDNN ran.
std::string run_and_check(const ls::host_context& ctx, const gemm_case& g, bool bf16, std::size_t samples) {
  operands<float> o(g, 42);
  if (bf16) {
    for (float& v : o.a) v = ls::round_to_bf16(v);
    for (float& v : o.b) v = ls::round_to_bf16(v);
  }
  check_gemm(ctx, g, o, samples);
  return ctx.gemm_cache().last_implementation();
}
}  // namespace

TEST_CASE("onednn: the float and bf16 GEMMs of the shapes where oneDNN's gemm-based matmul measured faster than its "
          "AVX-512 brgemm run it, every other shape runs oneDNN's first choice, and all match a double product") {
  // NT keeps oneDNN's first choice whatever the shape: it names the kernels this machine's oneDNN
  // prefers. Where that is the AVX-512 brgemm, the large NN shapes must have left it.
  {
    const ls::host_context ctx(1);
    ctx.activate();
    const std::string first = run_and_check(ctx, {trans::no, trans::yes, 256, 256, 256, 0, 1, 0}, false, 0);
    const std::string large = run_and_check(ctx, {trans::no, trans::no, 256, 256, 256, 0, 1, 0}, false, 0);
    const std::string large_acc = run_and_check(ctx, {trans::no, trans::no, 256, 256, 257, 3, 1, 1}, false, 0);
    const std::string small = run_and_check(ctx, {trans::no, trans::no, 64, 128, 784, 0, 1, 0}, false, 0);
    const std::string narrow = run_and_check(ctx, {trans::no, trans::no, 256, 10, 8192, 0, 1, 1}, false, 2000);
    const std::string transposed = run_and_check(ctx, {trans::yes, trans::no, 256, 256, 256, 0, 1, 0}, false, 0);
    MESSAGE("float: first choice " << first << "; NN 256x256x256 " << large << "; NN 64x128x784 " << small
                                   << "; NN 256x10x8192 " << narrow << "; TN 256x256x256 " << transposed);
    if (first == "brg:avx512_core") {
      CHECK(large.starts_with("gemm:"));
      CHECK(large_acc.starts_with("gemm:"));
      CHECK(small == first);
      CHECK(narrow == first);
      CHECK(transposed == first);
    } else {
      CHECK(large == first);  // any other first choice is kept
    }
  }
  if (ls::backend::detail::onednn_native_bf16()) {
    ls::host_context ctx(1, true, ls::compute_precision::bf16);
    ctx.set_gemm_precision(ls::compute_precision::bf16);
    ctx.activate();
    const std::string first = run_and_check(ctx, {trans::no, trans::yes, 256, 1024, 4096, 0, 1, 0}, true, 3000);
    const std::string deep = run_and_check(ctx, {trans::no, trans::no, 256, 1024, 4096, 0, 1, 0}, true, 3000);
    const std::string shallow = run_and_check(ctx, {trans::no, trans::no, 1024, 1024, 1024, 0, 1, 0}, true, 3000);
    const std::string smaller = run_and_check(ctx, {trans::no, trans::no, 128, 1024, 4096, 0, 1, 1}, true, 3000);
    MESSAGE("bf16: first choice " << first << "; NN 256x1024x4096 " << deep << "; NN 1024x1024x1024 " << shallow
                                  << "; NN 128x1024x4096 " << smaller);
    if (first == "brg:avx512_core_bf16") {
      CHECK(deep.starts_with("gemm:"));
      CHECK(shallow == first);
      CHECK(smaller == first);
    } else {
      CHECK(deep == first);
    }
  }
}
#endif

TEST_CASE("activate gives the calling thread the context's GEMM thread budget") {
  const ls::host_context two(2), one(1);
  two.activate();
  CHECK(openblas_get_num_threads() <= 2);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN) && DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  CHECK(omp_get_max_threads() == 2);
#endif
  one.activate();
  CHECK(openblas_get_num_threads() == 1);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN) && DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  CHECK(omp_get_max_threads() == 1);
  // A GEMM applies its context's budget even where the context was not activated.
  const std::vector<float> a(4, 1.0f), b(4, 1.0f);
  std::vector<float> c(4, 0.0f);
  gemm(two, trans::no, trans::no, 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
  CHECK(omp_get_max_threads() == 2);
  CHECK(c[3] == 2.0f);
  one.activate();
#endif
}
