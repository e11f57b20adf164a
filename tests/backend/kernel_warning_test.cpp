// The warning about slow host GEMM kernels: generic OpenBLAS kernels (which an OpenBLAS older than
// the CPU picks) on a CPU with AVX2 or AVX-512 name the fix, kernels that fit the CPU say nothing,
// and fit shows the warning on the chief's progress display. CTest runs this file's cases a second
// time with OPENBLAS_CORETYPE=Prescott (backend/generic_openblas_kernels_warned), where the
// warning must appear on any AVX2 CPU. fit_options::show_kernels names the kernels on request.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/data.hpp>
#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

#if !defined(LOCKSTEP_HOST_GEMM_ONEDNN) && defined(__x86_64__)
/// Whether this CPU has AVX2 / AVX-512 (the OpenBLAS build's warning depends on them).
bool cpu_avx2() { return __builtin_cpu_supports("avx2") != 0; }
bool cpu_avx512() { return __builtin_cpu_supports("avx512f") != 0; }
#endif

/// What fit prints on its progress display for one epoch of a tiny model on one host device.
std::string fit_output(bool quiet, bool show_kernels = false) {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  ls::one_device<ls::cpu<0>> s;
  auto m = s.replicate<ls::sequential<ls::dense<4, 3>>>(ls::seed{1});
  std::vector<float> x(16 * 4, 0.5f);
  std::vector<std::int32_t> y(16, 1);
  ls::fit_options o;
  o.epochs = 1;
  o.quiet = quiet;
  o.show_kernels = show_kernels;
  o.progress.stream = f;
  o.progress.live = false;
  (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{},
                ls::data::from_memory(std::move(x), 4, std::move(y)) | ls::data::batched(8), o);
  std::rewind(f);
  std::string out;
  for (int c = std::fgetc(f); c != EOF; c = std::fgetc(f)) out.push_back(static_cast<char>(c));
  std::fclose(f);
  return out;
}

}  // namespace

TEST_CASE("blas_kernel_warning: generic OpenBLAS kernels on an AVX2 or AVX-512 CPU name the fix, and kernels that fit say nothing") {
  for (const char* generic : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Barcelona", "Atom", "Generic"}) {
    CAPTURE(generic);
    const std::string avx2 = ls::blas_kernel_warning(generic, true, false);
    CHECK(has(avx2, std::string("its ") + generic + " kernels"));
    CHECK(has(avx2, "AVX2"));
    CHECK(has(avx2, "OPENBLAS_CORETYPE=Haswell"));
    CHECK(has(avx2, "-DLOCKSTEP_HOST_GEMM=onednn"));
    const std::string avx512 = ls::blas_kernel_warning(generic, true, true);
    CHECK(has(avx512, "AVX-512"));
    CHECK(has(avx512, "OPENBLAS_CORETYPE=SkylakeX"));
    CHECK(ls::blas_kernel_warning(generic, false, false).empty());  // an old CPU: the kernels fit it
  }
  for (const char* fast : {"Haswell", "Zen", "SkylakeX", "COOPERLAKE", "sapphirerapids", "Excavator"}) {
    CAPTURE(fast);
    CHECK(ls::blas_kernel_warning(fast, true, false).empty());
    CHECK(ls::blas_kernel_warning(fast, true, true).empty());
  }
}

TEST_CASE("host_gemm_warning: the kernels in use on this CPU, and fit shows it unless quiet") {
  const std::string warning = ls::host_gemm_warning();
  MESSAGE("host GEMM: ", ls::host_gemm_name(), "; warning: ", warning.empty() ? "none" : warning);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN) || !defined(__x86_64__)
  CHECK(warning.empty());
#else
  CHECK(warning == ls::blas_kernel_warning(ls::blas_core_name(), cpu_avx2(), cpu_avx512()));
  // Under backend/generic_openblas_kernels_warned, OpenBLAS runs the kernel set named here.
  if (const char* forced = std::getenv("LOCKSTEP_TEST_FORCED_BLAS_CORE")) {
    CHECK(ls::blas_core_name() == std::string(forced));
    if (cpu_avx2()) CHECK(!warning.empty());
  }
#endif
  const std::string shown = fit_output(false);
  if (warning.empty())
    CHECK(!has(shown, "OPENBLAS_CORETYPE"));
  else
    CHECK(has(shown, warning + "\n"));
  CHECK(!has(fit_output(true), "OPENBLAS_CORETYPE"));
}

TEST_CASE("fit_options::show_kernels names the host GEMM's kernels before the first epoch, only on request") {
  const std::string line =
      "lockstep: host GEMM " + ls::host_gemm_name() + ", loops " + ls::host_loops_name() + ", precision fp32\n";
  const std::string shown = fit_output(false, true);
  CHECK(has(shown, line));
  CHECK(shown.find(line) < shown.find("epoch 1/1"));
  CHECK(!has(fit_output(false), "lockstep: host GEMM "));
  CHECK(!has(fit_output(true, true), "lockstep: host GEMM "));  // quiet wins
}
