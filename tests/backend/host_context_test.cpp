// host_context: the thread budget and the floating-point mode a replica's thread computes in.
#include <doctest/doctest.h>

#include <lockstep/backend/host.hpp>

#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace {

/// x * y computed at run time (volatile operands: no constant folding).
float product(float x, float y) {
  volatile float a = x, b = y;
  return a * b;
}

}  // namespace

#if defined(__x86_64__) || defined(__SSE2__)
TEST_CASE("host_context::activate flushes subnormal floats to zero unless told not to") {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved & ~0x8040u);  // start from IEEE gradual underflow
  const float tiny = 1e-30f;
  CHECK(product(tiny, 1e-10f) != 0.0f);  // 1e-40 is subnormal, not zero, by default

  lockstep::host_context keep(1, false);
  CHECK_FALSE(keep.flushes_denormals());
  keep.activate();
  CHECK(product(tiny, 1e-10f) != 0.0f);  // the thread's mode is left alone

  lockstep::host_context flush;  // the default
  CHECK(flush.flushes_denormals());
  flush.activate();
  CHECK(product(tiny, 1e-10f) == 0.0f);     // FTZ: a subnormal result becomes 0
  CHECK(product(tiny, 1e10f) == doctest::Approx(1e-20f));  // normal numbers are untouched
  volatile float sub = 0;
  _mm_setcsr(saved & ~0x8040u);
  sub = product(tiny, 1e-10f);  // make a subnormal input with gradual underflow
  flush.activate();
  CHECK(product(sub, 1e30f) == 0.0f);  // DAZ: a subnormal input reads as 0
  _mm_setcsr(saved);
}
#endif

TEST_CASE("host_context: the BLAS thread budget is checked") {
  CHECK_THROWS_AS(lockstep::host_context(0), lockstep::config_error);
  CHECK(lockstep::host_context(3).blas_threads() == 3);
}

TEST_CASE("backend_traits<cpus>: strategy_options::tf32 is refused for host replicas") {
  CHECK_THROWS_AS(lockstep::backend_traits<lockstep::cpus>::make_context(0, lockstep::replica_settings{.tf32 = true}),
                  lockstep::config_error);
  CHECK_NOTHROW(lockstep::backend_traits<lockstep::cpus>::make_context(0, lockstep::replica_settings{}));
}
