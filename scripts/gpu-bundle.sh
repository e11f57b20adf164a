#!/usr/bin/env bash
# Builds lockstep's GPU programs here (no GPU needed) and collects them into one folder that runs on
# a GPU machine without compilers, package managers or network:
#   bin/test_cuda, bin/bench_cuda_mlp, bin/fashion_mnist_cuda  (sm_90 code + compute_90 PTX;
#       reference BLAS, zlib, libstdc++ and the CUDA runtime linked statically; see
#       tests/cuda/CMakeLists.txt for why not OpenBLAS)
#   data/fashion-mnist/*.gz, gpu-check.sh, torch_mlp.py, MANIFEST.txt (ldd of every program, sizes,
#       the newest glibc symbol version they need, the source commit)
#   fallback/: the source tree and the headers a bare GPU machine lacks (doctest, {fmt}, CLI11,
#       CBLAS, zlib), to build there with nvcc and CMake if the programs do not start.
# cuBLAS and NCCL are not shipped (hundreds of MiB): gpu-check.sh finds them on the GPU machine.
#
#   scripts/gpu-bundle.sh [--build-dir DIR] [--out DIR] [--no-build] [--check]
#     --build-dir  build folder (default build-gpu-bundle); configured with LOCKSTEP_CUDA=ON,
#                  CMAKE_CUDA_ARCHITECTURES=90, LOCKSTEP_CUDA_STATIC_RUNTIME=ON, LOCKSTEP_GPU_PORTABLE=ON
#     --out        the bundle folder (default <build-dir>/gpu-bundle); replaced
#     --no-build   collect what the build folder already holds (the CTest check does this)
#     --check      then check the bundle: every program's ldd lists only libc, libm, libpthread,
#                  libdl, librt, libstdc++, libgcc_s, libcuda, libcudart, libcublas, libcublasLt,
#                  libnccl (and the loader) and no glibc symbol newer than 2.34; the folder is
#                  under 64 MiB; every program starts here
#                  and reports "no CUDA device" (test_cuda: exit 0 with every GPU case skipped;
#                  bench_cuda_mlp: exit 3; fashion_mnist_cuda --device gpu: exit 2).
# Exit code: 0 when the bundle was made (and, with --check, passed); 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=build-gpu-bundle
out=""
do_build=1
do_check=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --check) do_check=1; shift ;;
    *) echo "gpu-bundle: unknown option $1" >&2; exit 1 ;;
  esac
done
out=${out:-$build/gpu-bundle}
programs=(test_cuda bench_cuda_mlp fashion_mnist_cuda)
data_dir=/usr/share/datasets/fashion-mnist
limit_bytes=$((64 * 1024 * 1024))

if [ "$do_build" = 1 ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WERROR=ON -DLOCKSTEP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLOCKSTEP_CUDA_STATIC_RUNTIME=ON -DLOCKSTEP_GPU_PORTABLE=ON
  cmake --build "$build" -j "$(nproc)" --target "${programs[@]}"
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/data/fashion-mnist" "$out/fallback/deps"
for p in "${programs[@]}"; do
  src="$build/tests/cuda/$p"
  [ -x "$src" ] || { echo "gpu-bundle: $src was not built" >&2; exit 1; }
  # Symbols are kept (compute-sanitizer names the kernel and the host frame); only debug info goes.
  objcopy --strip-debug "$src" "$out/bin/$p"
done
cp "$data_dir"/*.gz "$out/data/fashion-mnist/"
cp scripts/gpu-check.sh benchmarks/cuda/torch_mlp.py "$out/"

# Fallback: the sources (tracked files of this checkout) and the headers a bare machine lacks.
src_parts=(include cmake tests benchmarks examples scripts CMakeLists.txt)
if git -C "$root" rev-parse --verify -q HEAD >/dev/null 2>&1; then
  git -C "$root" archive --format=tar HEAD "${src_parts[@]}" | gzip -9 >"$out/fallback/lockstep-src.tar.gz"
else
  tar -C "$root" -czf "$out/fallback/lockstep-src.tar.gz" "${src_parts[@]}"
fi
header_dir() { printf '#include <%s>\n' "$1" | g++ -std=c++20 -M -x c++ - 2>/dev/null | tr ' \\' '\n\n' |
  grep "/$1\$" | tail -n1 | sed "s|/$1\$||"; }
for h in doctest/doctest.h fmt/core.h CLI/CLI.hpp; do
  d=$(header_dir "$h")
  [ -n "$d" ] && cp -r "$d/${h%%/*}" "$out/fallback/deps/"
done
for h in cblas.h openblas_config.h zlib.h zconf.h; do
  f=$(header_dir "$h")
  [ -n "$f" ] && cp -L "$f/$h" "$out/fallback/deps/"
done

{
  echo "lockstep GPU bundle"
  echo "source: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "architectures: sm_90 code, compute_90 PTX"
  for p in "${programs[@]}"; do
    echo
    echo "== bin/$p ($(stat -c %s "$out/bin/$p") bytes; newest glibc symbol version:" \
      "$(objdump -T "$out/bin/$p" | grep -o 'GLIBC_[0-9.]*' | sort -V | tail -n1))"
    ldd "$out/bin/$p" 2>&1 | sed 's/^\s*/  /; s/ (0x[0-9a-f]*)//'
  done
  echo
  echo "total: $(du -sb "$out" | cut -f1) bytes"
} >"$out/MANIFEST.txt"
echo "gpu-bundle: $out ($(du -sh "$out" | cut -f1))"

[ "$do_check" = 1 ] || exit 0

# --- the check ----------------------------------------------------------------------------------
fail=0
bad() { echo "gpu-bundle check: FAILED: $*"; fail=1; }
allowed='^(linux-vdso\.so|/?.*ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
for p in "${programs[@]}"; do
  while read -r lib _; do
    [ -z "$lib" ] && continue
    [[ "$lib" =~ $allowed ]] || bad "bin/$p needs $lib"
  done < <(ldd "$out/bin/$p" 2>&1 | sed 's/^\s*//')
done
for p in "${programs[@]}"; do  # loadable with glibc 2.34 (RHEL 9) and 2.35 (Ubuntu 22.04)
  newest=$(objdump -T "$out/bin/$p" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)
  [ "$(printf '%s\n2.34\n' "$newest" | sort -V | tail -n1)" = 2.34 ] || bad "bin/$p needs glibc $newest (at most 2.34 allowed)"
done
size=$(du -sb "$out" | cut -f1)
[ "$size" -lt "$limit_bytes" ] || bad "the bundle holds $size bytes, over 64 MiB"

log="$out/check.log"
: >"$log"
run_here() {  # run_here <expected exit> <name> <command...>: runs with a 60 s limit, checks exit and output
  local want=$1 name=$2 rc=0
  shift 2
  timeout 60 "$@" >"$out/check-$name.log" 2>&1 || rc=$?
  cat "$out/check-$name.log" >>"$log"
  [ "$rc" -eq "$want" ] || bad "$name exited $rc (expected $want), see $out/check-$name.log"
  grep -q "no CUDA device" "$out/check-$name.log" || bad "$name did not report \"no CUDA device\""
}
if [ "$(ldd "$out/bin/bench_cuda_mlp" | grep -c 'not found')" -gt 0 ]; then
  bad "cuBLAS is not resolvable here, so the programs cannot be started (see MANIFEST.txt)"
else
  run_here 0 test_cuda "$out/bin/test_cuda"
  if grep -qE '^\[doctest\] test cases: +[0-9]+ \| +[0-9]+ passed \| +0 failed' "$out/check-test_cuda.log"; then :; else
    bad "test_cuda did not report a clean doctest summary"
  fi
  run_here 3 bench_cuda_mlp "$out/bin/bench_cuda_mlp"
  run_here 2 fashion_mnist_cuda "$out/bin/fashion_mnist_cuda" --device gpu --epochs 1 --data "$out/data/fashion-mnist"
fi
if [ "$fail" = 0 ]; then
  echo "gpu-bundle check: passed ($size bytes; $(grep -c 'skipped: no CUDA device' "$out/check-test_cuda.log") GPU cases skipped here)"
fi
exit "$fail"
