#!/usr/bin/env bash
# Installs what lockstep needs, builds every target with -Wall -Wextra -Wpedantic -Werror, runs all
# tests with CTest (including a 10 s run of each fuzz harness of tests/fuzz under ASan and UBSan,
# CTest label `fuzz`, built with clang in <build>/fuzz, and the interop tests, label `interop`,
# which read lockstep's files with TensorBoard and PyTorch in <build>/interop/venv and report
# themselves skipped when Python's packages cannot be had), builds the host tests and examples
# with clang++ and the oneDNN host GEMM (LOCKSTEP_HOST_GEMM=onednn) under AddressSanitizer and
# UndefinedBehaviorSanitizer and runs those tests, then runs the input-pipeline tests and the
# reducer and stage conformance suites once more under ThreadSanitizer. CTest runs as many tests
# at once as there are cores.
# The CUDA targets are built (compiled and linked) whenever nvcc is present; GPU tests skip
# themselves when no GPU is usable, and the GPU bundle (scripts/gpu-bundle.sh) is collected from
# them and checked. Exit code: 0 when everything passed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
lockstep_install_deps
echo "lockstep: dependencies installed in $SECONDS s"

build=${LOCKSTEP_BUILD_DIR:-build}
jobs=$(nproc)
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"  # the gcc preset's LOCKSTEP_CUDA=AUTO finds it
fi

# Runs the tests of build directory $1 (log in $1/ctest-summary.log); sets ran_total and
# ran_skipped from the summary. A failing test ends the script (set -e, pipefail), and so does a
# run in which no test passed (no tests registered, or every one skipped).
run_tests() {
  local log="$1/ctest-summary.log"
  ctest --test-dir "$1" --output-on-failure --no-tests=error --timeout 600 -j "$jobs" "${@:2}" | tee "$log"
  ran_total=$(sed -n 's/.* tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$log" | tail -n 1)
  ran_skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$log" || true)
  if [ -z "$ran_total" ] || ((ran_total - ran_skipped <= 0)); then
    echo "lockstep: no test passed in $1 (${ran_total:-no} tests run, $ran_skipped skipped; see $log)" >&2
    exit 1
  fi
}

# The build configurations are the configure presets of CMakePresets.json; each is built once, in
# its own directory, and its tests run:
#  - gcc: every target with g++ and OpenBLAS as the host GEMM (with CUDA, every header is also
#    compiled alone under nvcc, and lockstep's GPU programs are linked as for the GPU bundle:
#    static BLAS, zlib, libstdc++ and CUDA runtime, and the CTest test cuda/gpu_bundle checks the
#    bundle made from them); every test;
#  - clang: the host path with clang++ and the host float GEMM through oneDNN's matmul primitive
#    (CUDA, the fuzz harnesses, MPI and interop ran above): every header alone with -Wpedantic,
#    tests and examples built at -O1 under AddressSanitizer and UndefinedBehaviorSanitizer (any
#    report ends the test that made it; clang's warnings come from its front end; the g++ build
#    runs the tests at -O3), the tests run;
#  - tsan: the pipeline tests, the reducer and stage conformance suites, the bf16 weight copy's
#    and the sharded update's tests (test_threads) under ThreadSanitizer (the pipeline's stages,
#    the reducers and the sharded update use threads).
# The targets each configuration builds are set on the command line too: a build directory
# configured before keeps its cache (scripts/demo.sh's has LOCKSTEP_BUILD_TESTS=OFF,
# benchmarks/run.sh's LOCKSTEP_FUZZ=OFF).
declare -A passed skipped_of
for preset in gcc clang tsan; do
  dir="$build"
  [ "$preset" = gcc ] || dir="${build}-${preset}"
  generator=()
  [ -f "$dir/CMakeCache.txt" ] || generator=(-G Ninja)  # a build directory made before keeps its generator
  case "$preset" in
    gcc) targets=(-DLOCKSTEP_BUILD_TESTS=ON -DLOCKSTEP_BUILD_EXAMPLES=ON -DLOCKSTEP_BUILD_BENCHMARKS=ON -DLOCKSTEP_FUZZ=AUTO) ;;
    clang) targets=(-DLOCKSTEP_BUILD_TESTS=ON -DLOCKSTEP_BUILD_EXAMPLES=ON) ;;
    tsan) targets=(-DLOCKSTEP_BUILD_TESTS=ON) ;;
  esac
  started=$SECONDS
  cmake --preset "$preset" -S . -B "$dir" "${generator[@]}" "${targets[@]}"
  case "$preset" in
    gcc | clang)
      cmake --build "$dir" -j "$jobs"
      built=$SECONDS
      [ "$preset" = gcc ] || echo "lockstep: running the host tests built with clang++ and the oneDNN host GEMM, under ASan and UBSan"
      run_tests "$dir"
      echo "lockstep: $preset: configured and built in $((built - started)) s, tests ran in $((SECONDS - built)) s"
      ;;
    tsan)
      cmake --build "$dir" -j "$jobs" --target test_data test_threads
      built=$SECONDS
      echo "lockstep: running the pipeline tests and the reducer and stage suites under ThreadSanitizer"
      TSAN_OPTIONS="halt_on_error=1" "$dir/tests/test_data"
      TSAN_OPTIONS="halt_on_error=1" "$dir/tests/test_threads"
      echo "lockstep: $preset: configured and built in $((built - started)) s, tests ran in $((SECONDS - built)) s"
      continue
      ;;
  esac
  passed[$preset]=$((ran_total - ran_skipped))
  skipped_of[$preset]=$ran_skipped
done
echo "lockstep: all tests passed (GPU tests skip themselves where no GPU is usable)"
echo "lockstep: g++ build ${passed[gcc]} passed, ${skipped_of[gcc]} skipped; clang++ and oneDNN GEMM build ${passed[clang]} passed, ${skipped_of[clang]} skipped"
echo "lockstep: $((passed[gcc] + passed[clang])) passed, 0 failed, $((skipped_of[gcc] + skipped_of[clang])) skipped"
