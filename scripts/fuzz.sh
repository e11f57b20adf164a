#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz with clang (AddressSanitizer and
# UndefinedBehaviorSanitizer), writes their seed corpora, and runs each harness for SECONDS, one
# after the other on one core. Prints, per harness, the executions, executions per second,
# crashes (any sanitizer report, escaping exception other than lockstep::error, hang over 10 s or
# memory over the limits) and the peak resident memory.
#
#   scripts/fuzz.sh [--build-only | --no-build] [SECONDS [HARNESS...]]
#
# SECONDS defaults to 300; HARNESS is any of idx csv checkpoint checkpoint_crc safetensors tar npy
# png jpeg (default: all; png and jpeg need libpng and libjpeg-turbo).
# Environment: LOCKSTEP_FUZZ_DIR (build directory, default build-fuzz), LOCKSTEP_FUZZ_CXX (the
# clang++ to use, default clang++). The corpus of each harness grows in $LOCKSTEP_FUZZ_DIR/corpus/,
# and the input of a failure is written to $LOCKSTEP_FUZZ_DIR/artifacts/<harness>/, where those of
# earlier runs stay (the crashes column counts this run's only). Exit code: 0 when no harness failed.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=all
case "${1:-}" in
  --build-only) mode=build; shift ;;
  --no-build) mode=run; shift ;;
esac
seconds=${1:-300}
if (($# > 0)); then shift; fi
harnesses=("$@")
if ((${#harnesses[@]} == 0)); then harnesses=(idx csv checkpoint checkpoint_crc safetensors tar npy png jpeg); fi
dir=${LOCKSTEP_FUZZ_DIR:-build-fuzz}
cxx=${LOCKSTEP_FUZZ_CXX:-clang++}

if [ "$mode" != run ]; then
  source scripts/deps.sh
  lockstep_install_deps
  cmake -S tests/fuzz -B "$dir" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$dir" -j "$(nproc)"
  rm -rf "$dir/seeds"
  "$dir/fuzz_seeds" "$dir/seeds"
  if [ "$mode" = build ]; then exit 0; fi
fi

# The memory limits: resident memory of the whole process (sanitizer overhead included, with
# ASan's quarantine of freed blocks kept at 16 MiB) and any single allocation.
rss_limit_mb=256
malloc_limit_mb=64
failed=0
# Inputs newer than this stamp are this run's; older ones in the artifacts folders are earlier runs'.
mkdir -p "$dir"
stamp=$(mktemp "$dir/.run-stamp.XXXXXX")  # on the artifacts' file system: -newer compares its times
trap 'rm -f "$stamp"' EXIT
printf '%-16s %12s %10s %8s %14s\n' harness executions exec/s crashes "peak RSS MiB"
for h in "${harnesses[@]}"; do
  bin="$dir/fuzz_$h"
  seeds="$dir/seeds/${h%_crc}"
  if [ ! -x "$bin" ] || [ ! -d "$seeds" ]; then
    echo "lockstep: $bin or $seeds is missing; run scripts/fuzz.sh --build-only first" >&2
    exit 2
  fi
  corpus="$dir/corpus/$h"
  artifacts="$dir/artifacts/$h/"
  log="$dir/logs/$h.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  rc=0
  ASAN_OPTIONS="quarantine_size_mb=16:detect_leaks=1:abort_on_error=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb="$rss_limit_mb" \
    -malloc_limit_mb="$malloc_limit_mb" -print_final_stats=1 -artifact_prefix="$artifacts" \
    "$corpus" "$seeds" >"$log" 2>&1 || rc=$?
  stat() { sed -n "s/^stat::$1: *\([0-9]*\).*/\1/p" "$log" | tail -n 1; }
  crashes=$(find "$artifacts" -type f -newer "$stamp" | wc -l)
  earlier=$(find "$artifacts" -type f ! -newer "$stamp" | wc -l)
  if ((rc != 0)) && ((crashes == 0)); then crashes=1; fi
  printf '%-16s %12s %10s %8s %14s\n' "$h" "$(stat number_of_executed_units)" "$(stat average_exec_per_sec)" \
    "$crashes" "$(stat peak_rss_mb)"
  if ((rc != 0)); then
    failed=1
    echo "lockstep: fuzz_$h failed (exit $rc); its log is $log, the input in $artifacts:" >&2
    find "$artifacts" -type f -newer "$stamp" >&2
    grep -E 'ERROR|SUMMARY|runtime error|terminate|what\(\)' "$log" | head -n 20 >&2 || true
  fi
  if ((earlier > 0)); then
    echo "lockstep: fuzz_$h: $earlier input(s) of earlier runs are in $artifacts (not counted above)" >&2
  fi
done
exit "$failed"
