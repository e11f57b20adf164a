#!/usr/bin/env bash
# Compile cost of lockstep programs: compiles each example, a 40-layer dense+relu network
# trained with fit (benchmarks/compile/deep_mlp.cpp) and a LeNet-size CNN trained with fit
# (benchmarks/compile/lenet.cpp), alone with the release flags of the library
# target, under /usr/bin/time -v, and prints one line each:
#   target=<name> compile_s=<wall seconds> peak_mib=<peak resident MiB>
# A source that fails to compile prints compile_s=failed, and the script then exits 1.
# A folder example's other translation units get lines of their own, e.g. fashion_mnist.options
# (its command-line parsing, kept apart from the training code).
# Usage: benchmarks/compile_cost.sh [CXX]   (default g++; extra flags in CXXFLAGS)
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${1:-${CXX:-g++}}
flags=(-std=c++20 -O2 -fno-math-errno -Iinclude ${CXXFLAGS:-})
if ! [ -x /usr/bin/time ]; then
  echo "compile_cost.sh: /usr/bin/time is missing (apt-get install time)" >&2
  exit 2
fi
echo "compiler: $($cxx --version | head -n 1)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for src in examples/getting_started.cpp examples/mlp.cpp examples/fashion_mnist/main.cpp \
           examples/fashion_mnist/options.cpp benchmarks/compile/deep_mlp.cpp benchmarks/compile/lenet.cpp; do
  [ -f "$src" ] || continue
  name=$(basename "$src" .cpp)
  if [ "$(basename "$(dirname "$src")")" != examples ] && [ "$(dirname "$src")" != benchmarks/compile ]; then
    folder=$(basename "$(dirname "$src")")
    if [ "$name" = main ]; then name=$folder; else name=$folder.$name; fi
  fi
  if ! /usr/bin/time -v -o "$tmp/time" "$cxx" "${flags[@]}" -c "$src" -o "$tmp/$name.o" 2>"$tmp/err"; then
    cat "$tmp/err" >&2
    echo "target=$name compile_s=failed peak_mib=failed"
    status=1
    continue
  fi
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$tmp/time")
  secs=$(awk -F: '{ if (NF == 3) print $1 * 3600 + $2 * 60 + $3; else print $1 * 60 + $2 }' <<<"$wall")
  kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$tmp/time")
  echo "target=$name compile_s=$secs peak_mib=$((kib / 1024))"
done
exit "$status"
