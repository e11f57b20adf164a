#!/usr/bin/env bash
# Builds lockstep's GPU programs here (no GPU needed) and collects them into one self-contained
# folder that runs on a GPU machine without compilers, package managers or network:
#   bin/test_cuda, bin/bench_cuda_mlp, bin/fashion_mnist_cuda  (sm_90 code + compute_90 PTX; the
#       reference BLAS as host GEMM, zlib, libstdc++ and the CUDA runtime linked statically; no
#       optional reader; see tests/cuda/CMakeLists.txt)
#   lib/: any other shared library a program needs, found by the programs through an $ORIGIN run
#       path (empty today: the build links everything else statically)
#   data/fashion-mnist/*.gz, gpu-check.sh, torch_mlp.py, MANIFEST.txt (ldd of every program, sizes,
#       the newest glibc symbol version they need, the source commit)
# cuBLAS and NCCL are not shipped (hundreds of MiB): gpu-check.sh finds them on the GPU machine.
# Programs that do not start there are rebuilt from a source checkout with `gpu-check.sh --build`.
#
#   scripts/gpu-bundle.sh [--build-dir DIR] [--out DIR] [--no-build] [--check]
#     --build-dir  build folder (default build-gpu-bundle); configured with LOCKSTEP_CUDA=ON,
#                  CMAKE_CUDA_ARCHITECTURES=90, LOCKSTEP_CUDA_STATIC_RUNTIME=ON, LOCKSTEP_GPU_PORTABLE=ON,
#                  LOCKSTEP_HOST_GEMM=openblas
#     --out        the bundle folder (default <build-dir>/gpu-bundle); replaced
#     --no-build   collect what the build folder already holds (the CTest check does this)
#     --check      then check the bundle: every library a program needs (its NEEDED entries) is in the bundle's
#                  lib/ or one of glibc's (libc, libm, libpthread, libdl, librt, the loader),
#                  libgcc_s, or the CUDA driver/runtime set (libcuda, libcudart, libcublas,
#                  libcublasLt, libnccl), and no glibc symbol is newer than 2.34; the folder is
#                  at most 48 MiB; every program starts here and reports "no CUDA device"
#                  (test_cuda: exit 0 with every GPU case skipped; bench_cuda_mlp: exit 3;
#                  fashion_mnist_cuda --device gpu: exit 2); and the bundle's gpu-check.sh fails
#                  honestly here: exit 2 naming "no GPU", within 60 s, at most 7 files written.
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
limit_bytes=$((48 * 1024 * 1024))

if [ "$do_build" = 1 ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WERROR=ON -DLOCKSTEP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLOCKSTEP_CUDA_STATIC_RUNTIME=ON -DLOCKSTEP_GPU_PORTABLE=ON \
    -DLOCKSTEP_HOST_GEMM=openblas
  cmake --build "$build" -j "$(nproc)" --target "${programs[@]}"
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/data/fashion-mnist"
for p in "${programs[@]}"; do
  src="$build/tests/cuda/$p"
  [ -x "$src" ] || { echo "gpu-bundle: $src was not built" >&2; exit 1; }
  # Symbols are kept (compute-sanitizer names the kernel and the host frame); only debug info goes.
  objcopy --strip-debug "$src" "$out/bin/$p"
done
cp "$data_dir"/*.gz "$out/data/fashion-mnist/"
cp scripts/gpu-check.sh benchmarks/cuda/torch_mlp.py "$out/"

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
# glibc's libraries, libgcc_s, and the CUDA driver/runtime set; anything else must be in lib/.
allowed='^(linux-vdso\.so|/?.*ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libgcc_s\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
# The programs' own needs (NEEDED entries; what the CUDA libraries need in turn is theirs).
for p in "${programs[@]}"; do
  while read -r lib; do
    [ -z "$lib" ] && continue
    [[ "$lib" =~ $allowed ]] && continue
    [ -e "$out/lib/$lib" ] && continue
    bad "bin/$p needs $lib, which is neither in the bundle's lib/ nor in the CUDA driver/runtime set"
  done < <(readelf -d "$out/bin/$p" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done
for p in "${programs[@]}"; do  # loadable with glibc 2.34 (RHEL 9) and 2.35 (Ubuntu 22.04)
  newest=$(objdump -T "$out/bin/$p" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n1)
  [ "$(printf '%s\n2.34\n' "$newest" | sort -V | tail -n1)" = 2.34 ] || bad "bin/$p needs glibc $newest (at most 2.34 allowed)"
done
size=$(du -sb "$out" | cut -f1)
[ "$size" -le "$limit_bytes" ] || bad "the bundle holds $size bytes, over 48 MiB"

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
  # The check itself, as it runs on a GPU machine: here it must fail honestly and quickly.
  check_out="$out/check-gpu-check"
  rm -rf "$check_out"
  t0=$SECONDS rc=0
  timeout 120 "$out/gpu-check.sh" --bundle "$out" --out "$check_out" >"$out/check-gpu-check.log" 2>&1 || rc=$?
  took=$((SECONDS - t0))
  cat "$out/check-gpu-check.log" >>"$log"
  [ "$rc" -eq 2 ] || bad "gpu-check.sh exited $rc here (expected 2: no GPU), see $out/check-gpu-check.log"
  grep -q "no GPU" "$check_out/summary.txt" 2>/dev/null || bad "gpu-check.sh's summary.txt does not name \"no GPU\""
  [ "$took" -le 60 ] || bad "gpu-check.sh took $took s here (at most 60 s without a GPU)"
  files=$(find "$check_out" -type f | wc -l)
  [ "$files" -le 7 ] || bad "gpu-check.sh wrote $files files (at most 7)"
  rm -rf "$check_out"
fi
if [ "$fail" = 0 ]; then
  echo "gpu-bundle check: passed ($size bytes; $(grep -c 'skipped: no CUDA device' "$out/check-test_cuda.log") GPU cases skipped here; gpu-check.sh: exit 2, no GPU, $took s, $files files)"
fi
exit "$fail"
