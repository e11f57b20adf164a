// Linked into lockstep's portable GPU programs (LOCKSTEP_GPU_PORTABLE) only.
//  - The static libstdc++ of GCC 12 refers to arc4random (std::random_device), which glibc has
//    only since 2.36; defining it here keeps the programs loadable on glibc 2.34 and 2.35
//    (RHEL 9, Ubuntu 22.04), which GPU machines commonly run. Same contract as glibc's:
//    random bits from the kernel.
//  - These programs use the reference BLAS (their host BLAS work is the host side of the tests),
//    which lacks OpenBLAS's thread and kernel queries: single-threaded answers here.
#include <cblas.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" std::uint32_t arc4random() noexcept {
  std::uint32_t v = 0;
  auto* p = reinterpret_cast<unsigned char*>(&v);
  std::size_t got = 0;
  while (got < sizeof(v)) {
    const ssize_t n = getrandom(p + got, sizeof(v) - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      std::abort();  // as glibc: no entropy source is fatal
    }
  }
  return v;
}

extern "C" void openblas_set_num_threads(int) {}
extern "C" int openblas_get_num_threads(void) { return 1; }
extern "C" char* openblas_get_corename(void) {
  static char name[] = "reference BLAS";
  return name;
}
