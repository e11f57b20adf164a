#!/usr/bin/env bash
# Compile cost of the same networks in dlib (Debian's libdlib-dev; benchmarks/peers/setup.sh):
# benchmarks/peers/dlib/mlp.cpp (the main job's MLP) and benchmarks/peers/dlib/lenet.cpp (the CNN
# of benchmarks/compile/lenet.cpp), each compiled alone with the flags of benchmarks/compile_cost.sh
# (-std=c++20 -O2 -fno-math-errno) under /usr/bin/time -v. Prints one line each, as compile_cost.sh:
#   target=dlib_<name> compile_s=<wall seconds> peak_mib=<peak resident MiB>
# Usage: benchmarks/peers/dlib_compile_cost.sh [CXX]
set -euo pipefail
cd "$(dirname "$0")/../.."
cxx=${1:-${CXX:-g++}}
flags=(-std=c++20 -O2 -fno-math-errno ${CXXFLAGS:-})
if ! [ -f /usr/include/dlib/dnn.h ]; then
  echo "target=dlib_mlp skipped=dlib_not_installed"
  echo "target=dlib_lenet skipped=dlib_not_installed"
  exit 0
fi
echo "compiler: $($cxx --version | head -n 1)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in mlp lenet; do
  if ! /usr/bin/time -v -o "$tmp/time" "$cxx" "${flags[@]}" -c "benchmarks/peers/dlib/$name.cpp" -o "$tmp/$name.o" 2>"$tmp/err"; then
    cat "$tmp/err" >&2
    echo "target=dlib_$name compile_s=failed peak_mib=failed"
    continue
  fi
  wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$tmp/time")
  secs=$(awk -F: '{ if (NF == 3) print $1 * 3600 + $2 * 60 + $3; else print $1 * 60 + $2 }' <<<"$wall")
  kib=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$tmp/time")
  echo "target=dlib_$name compile_s=$secs peak_mib=$((kib / 1024))"
done
