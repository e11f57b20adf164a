#!/usr/bin/env bash
# The verdict logic of scripts/gpu-check.sh without a GPU: from the recorded passing run in
# tests/cuda/gpu_check_fixture, derives runs that must fail (one expected case missing, a
# sanitizer filter that matched nothing, a benchmark check mismatch, ...) and checks that
# `gpu-check.sh --verdict DIR` gives each its exit code and verdict line.
#   tests/cuda/gpu_check_dry_run.sh <gpu-check.sh> <fixture folder>
set -uo pipefail
check=${1:?gpu-check.sh} fixture=${2:?fixture folder}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0 cases=0

# expect <name> <exit code> <line the verdict must contain> [<line it must not contain>]: runs the
# verdict of $tmp/<name>.
expect() {
  local name=$1 want=$2 line=$3 absent=${4:-} rc=0 got
  cases=$((cases + 1))
  got=$("$check" --verdict "$tmp/$name" 2>&1) || rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -qF -- "$line" <<<"$got" || { [ -n "$absent" ] && grep -qF -- "$absent" <<<"$got"; }; then
    failures=$((failures + 1))
    echo "FAILED: $name: exit $rc (expected $want), expected the line \"$line\"${absent:+ and not \"$absent\"}; the verdict was:"
    sed 's/^/    /' <<<"$got"
  else
    echo "ok: $name: exit $rc, \"$line\""
  fi
}
# variant <name>: a fresh copy of the recorded run, to change.
variant() { cp -r "$fixture" "$tmp/$1"; }
# batch_norm_fails <name>: variant <name>'s log gains a failing [batch_norm] case, and test_cuda exits 1.
batch_norm_fails() {
  cat >>"$tmp/$1/tests.log" <<'EOF'
===============================================================================
tests/cuda/test_batch_norm.cu:40:
TEST CASE:  gpu: [batch_norm] statistics over the global batch match the host

tests/cuda/test_batch_norm.cu:52: ERROR: CHECK( got == want ) is NOT correct!
EOF
  echo 1 >"$tmp/$1/tests.rc"
}

variant all_ran
expect all_ran 0 "gpu-check: PASSED"
expect all_ran 0 "core: PASS (5 of 5 expected GPU cases ran, 0 failed)"
# test_cuda runs with --duration=true: every case, passing or not, prints a "TEST CASE:" header.
expect all_ran 0 "batch_norm: PASS (1 case(s))"
expect all_ran 0 "cnn_bn_fp32="

variant case_threw  # an exception out of a passing-looking case, as doctest reports it inside its block
sed -i '/^TEST CASE:  gpu: losses match/a\
\
tests/cuda/backend_test.cu:160: ERROR: test case THREW exception: evaluate_cols: bad width' "$tmp/case_threw/tests.log"
echo 1 >"$tmp/case_threw/tests.rc"
expect case_threw 4 "core: FAIL (failing: gpu: losses match the host, and a bad label is a data_error on the device too; 5 of 5"

variant one_missing  # a case the list names never printed that it ran
sed -i '/lockstep-gpu-case: ran gpu: staged shards/d' "$tmp/one_missing/tests.log"
expect one_missing 5 "core: FAIL (1 of 5 expected GPU case(s) did not run: gpu: staged shards arrive intact"

variant skipped_here  # the same case skipped for want of a device: not a pass either
sed -i 's/^lockstep-gpu-case: ran \(gpu: gemm.*\) (with.*/skipped: no CUDA device: cudaErrorNoDevice/' "$tmp/skipped_here/tests.log"
expect skipped_here 5 "core: FAIL (1 of 5 expected GPU case(s) did not run: gpu: gemm matches"

variant empty_filter  # a sanitizer pointed at no case
echo 0 >"$tmp/empty_filter/memcheck.expected"
expect empty_filter 7 "memcheck: FAIL (its case filter matched no case)" "gpu-check: PASSED"

variant sanitizer_short  # the sanitizer ran fewer cases than it was pointed at
sed -i '0,/lockstep-gpu-case: ran/{/lockstep-gpu-case: ran/d}' "$tmp/sanitizer_short/racecheck.log"
expect sanitizer_short 7 "racecheck: FAIL (2 of the 3 cases it was pointed at ran on a GPU)"

variant sanitizer_errors
sed -i 's/ERROR SUMMARY: 0 errors/ERROR SUMMARY: 2 errors/' "$tmp/sanitizer_errors/initcheck.log"
echo 97 >"$tmp/sanitizer_errors/initcheck.rc"
expect sanitizer_errors 7 "initcheck: FAIL (2 error(s) reported; see failures.txt)"

variant bench_mismatch  # a benchmark that exits 0 but whose check failed
sed -i 's/sum=3072 expected=3072 check=pass/sum=3070 expected=3072 check=fail/' "$tmp/bench_mismatch/bench.log"
expect bench_mismatch 6 "bench: FAIL (exit 0; check mismatch in: same_device_reducer)"

variant bench_exit
echo 4 >"$tmp/bench_exit/bench.rc"
sed -i '/^gpu_cnn /d' "$tmp/bench_exit/bench.log"
expect bench_exit 6 "bench: FAIL (exit 4; missing: 'gpu_cnn')"

variant low_accuracy
echo "test_accuracy=0.4210" >"$tmp/low_accuracy/example.log"
expect low_accuracy 6 "example: FAIL (test_accuracy=0.4210 below 0.80 after one epoch)"

variant crashed  # no doctest summary: test_cuda died
sed -i '/^\[doctest\] test cases:/,$d' "$tmp/crashed/tests.log"
echo 139 >"$tmp/crashed/tests.rc"
expect crashed 4 "core: FAIL (test_cuda exit 139 without its summary"

variant exit_after_summary  # the summary printed, then a crash at exit
echo 139 >"$tmp/exit_after_summary/tests.rc"
expect exit_after_summary 4 "core: FAIL (test_cuda exit 139 after its summary: a crash at exit"

variant crash_with_feature_failure  # the same while a feature's case failed too: still the core's
batch_norm_fails crash_with_feature_failure
echo 139 >"$tmp/crash_with_feature_failure/tests.rc"
expect crash_with_feature_failure 4 "core: FAIL (test_cuda exit 139 after its summary: a crash at exit"

variant failed_outside_cases  # doctest's failure exit with no failing case in the log
echo 1 >"$tmp/failed_outside_cases/tests.rc"
expect failed_outside_cases 4 "core: FAIL (test_cuda exit 1 after its summary, and no failing case in its log"

variant unlisted_failure  # doctest counts 2 failed cases, the log holds the block of one (a feature's)
sed -i 's/^\[doctest\] test cases: 12 | 12 passed | 0 failed/[doctest] test cases: 12 | 10 passed | 2 failed/' \
  "$tmp/unlisted_failure/tests.log"
batch_norm_fails unlisted_failure
expect unlisted_failure 4 "core: FAIL (doctest's summary counts 2 failed case(s), the log shows 1"

variant feature_broken  # a failing feature case: its own verdict, not the core's nor the exit code
batch_norm_fails feature_broken
expect feature_broken 0 "batch_norm: FAIL (1 of 1 case(s) ran, 1 failed)" "core: FAIL"

variant core_broken
cat >>"$tmp/core_broken/tests.log" <<'EOF'
===============================================================================
tests/cuda/backend_test.cu:40:
TEST CASE:  gpu: losses match the host, and a bad label is a data_error on the device too

tests/cuda/backend_test.cu:52: ERROR: CHECK( dx.sum == hx.sum ) is NOT correct!
EOF
echo 1 >"$tmp/core_broken/tests.rc"
expect core_broken 4 "core: FAIL (failing: gpu: losses match the host"

variant deadline
echo 124 >"$tmp/deadline/synccheck.rc"
expect deadline 8 "synccheck: FAIL (stopped by the deadline"

variant no_gpu
sed -i 's/devices=1/devices=0/; /lockstep-env: device=/d' "$tmp/no_gpu/env.log"
echo "lockstep-env: no CUDA device: cudaErrorNoDevice: no CUDA-capable device is detected" >>"$tmp/no_gpu/env.log"
: >"$tmp/no_gpu/gpus.txt"
expect no_gpu 2 "environment: FAIL (no GPU: no CUDA device: cudaErrorNoDevice"

variant unseen_gpu  # nvidia-smi lists a GPU that CUDA cannot use: not "no GPU"
sed -i 's/devices=1/devices=0/' "$tmp/unseen_gpu/env.log"
echo "lockstep-env: no CUDA device: cudaErrorInsufficientDriver: CUDA driver version is insufficient" >>"$tmp/unseen_gpu/env.log"
expect unseen_gpu 3 "environment: FAIL (nvidia-smi lists 1 GPU(s) but CUDA sees none: cudaErrorInsufficientDriver"

variant missing_library
echo " test_cuda(needs libcublas.so.13)" >"$tmp/missing_library/missing.txt"
expect missing_library 3 "environment: FAIL (cannot start the programs:  test_cuda(needs libcublas.so.13))"

echo "gpu-check dry run: $((cases - failures)) of $cases verdicts as expected"
[ "$failures" -eq 0 ]
