// bench_gemm: the host float GEMM lockstep uses (`gemm(host_context, ...)`: CBLAS, or oneDNN's
// cached matmul primitive in the LOCKSTEP_HOST_GEMM=onednn build) against cblas_sgemm called
// directly, on one thread, at the shapes of bench_step's config M (784-512-512-10, batch 256) and
// a few others, in one run. Built with oneDNN it also times oneDNN's own BLAS-like dnnl_sgemm.
// Prints once `openblas_core=<name> host_gemm=<name>` and per shape
//   shape=<m>x<n>x<k> trans=<NN|NT|TN|TT> beta=<0|1> openblas_us=<t> openblas_gflops=<r>
//     lockstep_us=<t> lockstep_gflops=<r> [dnnl_sgemm_us=<t>] speedup=<openblas time / lockstep time>
// Times are the thread's CPU time; every shape and kernel is timed in short interleaved repeats
// and keeps its best one. Options: --repeats N (default 30), --shape MxNxK[:TT[:BETA]] (repeatable;
// TT the transpositions of A and B, each N or T, default NN; BETA 0 or 1, default 0), for example
// --shape 512x4096x4096:NN:1 --shape 4096x4096x512:TN.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <cblas.h>
#include <time.h>

#include <fmt/core.h>

#include <lockstep/backend/host.hpp>

#include "timing.hpp"

namespace {

namespace ls = lockstep;
using ls::backend::trans;

using bench_timing::thread_seconds;

struct shape {
  std::size_t m, n, k;
  bool ta, tb;
  float beta;
};

struct operands {
  shape s;
  std::size_t lda, ldb, ldc;
  std::vector<float> a, b, c;
  explicit operands(const shape& x)
      : s(x), lda(x.ta ? x.m : x.k), ldb(x.tb ? x.k : x.n), ldc(x.n), a(x.m * x.k, 0.01f), b(x.k * x.n, 0.02f),
        c(x.m * x.n, 0.0f) {}
  void openblas() {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(),
                static_cast<int>(lda), b.data(), static_cast<int>(ldb), s.beta, c.data(), static_cast<int>(ldc));
  }
  void lockstep(const ls::host_context& ctx) {
    gemm(ctx, s.ta ? trans::yes : trans::no, s.tb ? trans::yes : trans::no, s.m, s.n, s.k, 1.0f, a.data(), lda,
         b.data(), ldb, s.beta, c.data(), ldc);
  }
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  void dnnl() {
    const dnnl_status_t st = dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', static_cast<dnnl_dim_t>(s.m),
                                        static_cast<dnnl_dim_t>(s.n), static_cast<dnnl_dim_t>(s.k), 1.0f, a.data(),
                                        static_cast<dnnl_dim_t>(lda), b.data(), static_cast<dnnl_dim_t>(ldb), s.beta,
                                        c.data(), static_cast<dnnl_dim_t>(ldc));
    ls::backend::detail::onednn_check(st, "dnnl_sgemm");
  }
#endif
  [[nodiscard]] double flops() const { return 2.0 * double(s.m) * double(s.n) * double(s.k); }
};

// Best time per call over `repeats` repeats of `calls` back-to-back calls.
template <class F>
void time_into(double& best, int calls, const F& f) {
  const double t0 = thread_seconds();
  for (int i = 0; i < calls; ++i) f();
  best = std::min(best, (thread_seconds() - t0) / calls);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 30;
  std::vector<shape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::size_t m = 0, n = 0, k = 0;
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--shape" && i + 1 < argc) {
      const std::string spec = argv[++i];
      char ta = 'N', tb = 'N';
      int beta = 0, used = 0;
      const int got = std::sscanf(spec.c_str(), "%zux%zux%zu%n:%c%c%n:%d%n", &m, &n, &k, &used, &ta, &tb, &used, &beta, &used);
      const bool ok = got >= 3 && m > 0 && n > 0 && k > 0 && static_cast<std::size_t>(used) == spec.size() &&
                      (ta == 'N' || ta == 'T') && (tb == 'N' || tb == 'T') && (beta == 0 || beta == 1);
      if (!ok) {
        std::fprintf(stderr, "bench_gemm: --shape %s: expected MxNxK[:TT[:BETA]], for example 512x4096x1024:TN:1\n",
                     spec.c_str());
        return 2;
      }
      shapes.push_back({m, n, k, ta == 'T', tb == 'T', static_cast<float>(beta)});
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--shape MxNxK[:TT[:BETA]]]...\n", argv[0]);
      return 2;
    }
  }
  if (shapes.empty())
    shapes = {
        // bench_step config M (784-512-512-10, batch 256), in its order: forward x.W (beta 0 before a
        // ReLU, beta 1 onto the last layer's broadcast bias), then per layer dW = xT.dy and dx = dy.WT
        {256, 512, 784, false, false, 0.0f},
        {256, 512, 512, false, false, 0.0f},
        {256, 10, 512, false, false, 1.0f},
        {512, 10, 256, true, false, 0.0f},
        {256, 512, 10, false, true, 0.0f},
        {512, 512, 256, true, false, 0.0f},
        {256, 512, 512, false, true, 0.0f},
        {784, 512, 256, true, false, 0.0f},
        // the input gradient of the first layer (not computed by a step) and a large square
        {256, 784, 512, false, true, 0.0f},
        {1024, 1024, 1024, false, false, 0.0f},
    };
  try {
    openblas_set_num_threads(1);
    const ls::host_context ctx(1);
    ctx.activate();
    fmt::print("openblas_core={} host_gemm={} threads=1\n", ls::blas_core_name(), ls::host_gemm_name());
    for (const shape& s : shapes) {
      operands o(s);
      const int calls = std::max(1, static_cast<int>(2e8 / std::max(1.0, o.flops())));  // ~0.01-0.05 s a repeat
      double openblas = 1e30, lockstep = 1e30, dnnl = 1e30;
      o.openblas();
      o.lockstep(ctx);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
      o.dnnl();
#endif
      for (int r = 0; r < repeats; ++r) {
        time_into(openblas, calls, [&] { o.openblas(); });
        time_into(lockstep, calls, [&] { o.lockstep(ctx); });
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
        time_into(dnnl, calls, [&] { o.dnnl(); });
#endif
      }
      std::string extra;
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
      extra = fmt::format(" dnnl_sgemm_us={:.1f}", dnnl * 1e6);
#else
      (void)dnnl;
#endif
      fmt::print("shape={}x{}x{} trans={}{} beta={} openblas_us={:.1f} openblas_gflops={:.1f} lockstep_us={:.1f} "
                 "lockstep_gflops={:.1f}{} speedup={:.2f}\n",
                 s.m, s.n, s.k, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.beta, openblas * 1e6, o.flops() / openblas / 1e9,
                 lockstep * 1e6, o.flops() / lockstep / 1e9, extra, openblas / lockstep);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
