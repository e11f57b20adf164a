#!/usr/bin/env bash
# Installs what lockstep needs, builds every target with -Wall -Wextra -Wpedantic -Werror, runs all
# tests with CTest (including a 20 s run of each fuzz harness of tests/fuzz under ASan and UBSan,
# CTest label `fuzz`, built with clang in <build>/fuzz, and the interop tests, label `interop`,
# which read lockstep's files with TensorBoard and PyTorch in <build>/interop/venv and report
# themselves skipped when Python's packages cannot be had), builds the host tests, examples and
# benchmarks with clang++ too and runs those tests, builds and runs the host tests once more with
# the oneDNN host GEMM (LOCKSTEP_HOST_GEMM=onednn), then runs the input-pipeline tests and the
# reducer and stage conformance suites once more under ThreadSanitizer.
# The CUDA targets are built (compiled and linked) whenever nvcc is present; GPU tests skip
# themselves when no GPU is usable, and the GPU bundle (scripts/gpu-bundle.sh) is collected from
# them and checked. Exit code: 0 when everything passed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
lockstep_install_deps

build=${LOCKSTEP_BUILD_DIR:-build}
jobs=$(nproc)
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=AUTO
  export PATH="$PATH:/usr/local/cuda/bin"
fi

# With CUDA, lockstep's GPU programs are linked as for the GPU bundle (static BLAS, zlib,
# libstdc++ and CUDA runtime), and the CTest test cuda/gpu_bundle checks the bundle made from them.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WERROR=ON -DLOCKSTEP_CUDA="$cuda" \
  -DLOCKSTEP_CUDA_STATIC_RUNTIME=ON -DLOCKSTEP_GPU_PORTABLE=ON
cmake --build "$build" -j "$jobs"
# Runs the tests of build directory $1 (log in $1/ctest-summary.log); sets ran_total and
# ran_skipped from the summary. A failing test ends the script (set -e, pipefail).
run_tests() {
  local log="$1/ctest-summary.log"
  ctest --test-dir "$1" --output-on-failure --timeout 600 "${@:2}" | tee "$log"
  ran_total=$(sed -n 's/.* tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$log" | tail -n 1)
  ran_skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$log" || true)
}
run_tests "$build"
total=$ran_total skipped=$ran_skipped

# The host path compiles warning-free with clang++ as well (CUDA left out; the fuzz harnesses, the
# MPI tests and the interop tests already ran above): tests, examples and benchmarks are built, the
# tests run.
clang_build="${build}-clang"
CC=clang CXX=clang++ cmake -S . -B "$clang_build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WERROR=ON \
  -DLOCKSTEP_CUDA=OFF -DLOCKSTEP_FUZZ=OFF -DLOCKSTEP_MPI=OFF -DLOCKSTEP_INTEROP=OFF
cmake --build "$clang_build" -j "$jobs"
echo "lockstep: running the host tests built with clang++"
run_tests "$clang_build"
clang_total=$ran_total clang_skipped=$ran_skipped

# The host float GEMM through oneDNN's matmul primitive instead of CBLAS: the host tests again
# (CUDA, MPI, the fuzz harnesses, examples, benchmarks, and the header and compile-fail checks,
# which do not depend on the GEMM, left out: they ran above).
onednn_build="${build}-onednn"
cmake -S . -B "$onednn_build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WERROR=ON -DLOCKSTEP_HOST_GEMM=onednn \
  -DLOCKSTEP_CUDA=OFF -DLOCKSTEP_FUZZ=OFF -DLOCKSTEP_MPI=OFF -DLOCKSTEP_BUILD_EXAMPLES=OFF \
  -DLOCKSTEP_BUILD_BENCHMARKS=OFF
# The test binaries whose code reaches the host GEMM (the data, io, core, loss and optimiser
# tests do not: their results cannot change with it).
onednn_targets=(test_backend test_layers test_distribute test_train test_memory test_testing test_extending)
cmake --build "$onednn_build" -j "$jobs" --target "${onednn_targets[@]}"
echo "lockstep: running the host tests with the oneDNN host GEMM"
run_tests "$onednn_build" -LE build -R '^(backend|layers|distribute|train|memory|testing|extending)/'
onednn_total=$ran_total onednn_skipped=$ran_skipped

# The pipeline's stages use threads (prefetch, parallel_map), and so do the reducers: run the
# pipeline tests and the reducer and stage conformance suites (test_threads) under TSan too.
tsan="${build}-tsan"
cmake -S . -B "$tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_WERROR=ON -DLOCKSTEP_CUDA=OFF \
  -DLOCKSTEP_BUILD_EXAMPLES=OFF -DLOCKSTEP_BUILD_BENCHMARKS=OFF -DLOCKSTEP_FUZZ=OFF -DLOCKSTEP_MPI=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer"
cmake --build "$tsan" -j "$jobs" --target test_data test_threads
echo "lockstep: running the pipeline tests and the reducer and stage suites under ThreadSanitizer"
TSAN_OPTIONS="halt_on_error=1" "$tsan/tests/test_data"
TSAN_OPTIONS="halt_on_error=1" "$tsan/tests/test_threads"
echo "lockstep: all tests passed (GPU tests skip themselves where no GPU is usable)"
echo "lockstep: g++ build $((total - skipped)) passed, ${skipped} skipped; clang++ build $((clang_total - clang_skipped)) passed, ${clang_skipped} skipped; oneDNN GEMM build $((onednn_total - onednn_skipped)) passed, ${onednn_skipped} skipped"
echo "lockstep: $((total + clang_total + onednn_total - skipped - clang_skipped - onednn_skipped)) passed, 0 failed, $((skipped + clang_skipped + onednn_skipped)) skipped"
