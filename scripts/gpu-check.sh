#!/usr/bin/env bash
# Runs lockstep's GPU tests, benchmarks, example and sanitizer checks on a machine with a CUDA GPU
# and gives a verdict that cannot pass falsely. Works offline: no apt, no pip, no network.
#
#   scripts/gpu-check.sh --bundle DIR [--out DIR]   the programs of a bundle (scripts/gpu-bundle.sh;
#                                                   no compiler or CMake needed: the usual way)
#   scripts/gpu-check.sh --build [--out DIR]        builds test_cuda, bench_cuda_mlp and
#                                                   fashion_mnist_cuda here first (CMake, nvcc and
#                                                   the libraries of scripts/deps.sh; folder
#                                                   LOCKSTEP_GPU_BUILD_DIR, default build-gpu)
#   scripts/gpu-check.sh --verdict DIR              the verdict of a recorded run: DIR holds the raw
#                                                   logs a run archives in logs.tar.gz (the CTest
#                                                   dry run checks the verdict logic this way)
#
# Output: the folder --out DIR, else $OUT when set, else <bundle or build folder>/gpu-check, holds
# four files, rewritten after every phase so that a run stopped from outside still explains
# itself: summary.txt (phases, figures, ratios, verdict), environment.txt (GPUs, driver, CUDA
# runtime, the cuBLAS and NCCL actually loaded and from where, compute-sanitizer, PyTorch),
# failures.txt (every failing doctest block and sanitizer report) and logs.tar.gz (every log).
# Programs write their logs line-buffered (stdbuf), so a crash keeps its last lines.
#
# Time: the core verdict (tests, benchmark, example) is printed within 240 s of the start, with
# lockstep's figures; then the PyTorch baseline and compute-sanitizer run; everything ends within
# 360 s (LOCKSTEP_GPU_CHECK_DEADLINE). cuBLAS and NCCL are looked up in LD_LIBRARY_PATH, the CUDA
# toolkit's folders and python3's nvidia/*/lib (PyTorch's pip packages); what was found is put on
# LD_LIBRARY_PATH for lockstep's programs only (PyTorch runs with the environment it was given).
#
# Verdict: one line per part (environment, core, bench, example, memcheck, racecheck, initcheck,
# synccheck), one per GPU feature whose cases test_cuda has (batch_norm, batched_conv,
# no_host_wait, graph_capture, zero1, weight_copy: cases that name one in brackets, "gpu: [batch_norm] ..."; outside the exit code, so
# a broken feature cannot hide whether the core works), and the baseline ratios. The core passes
# only when every other case that `test_cuda --list-test-cases --test-case='gpu: *'` lists (and
# 'multigpu: *' with two GPUs) printed "lockstep-gpu-case: ran <name>" and none failed (a non-zero
# exit other than doctest's 1, a non-zero exit with no failing case in the log, or more failed
# cases in doctest's summary than failing blocks in the log, fails it); bench only
# with exit 0, every figure present and every check=pass; example only when it reached the
# accuracy (LOCKSTEP_GPU_CHECK_MIN_ACCURACY, default 0.80 after one epoch); a sanitizer only when
# its case filter matched cases, all of them ran, and it reported no error.
# Exit code (the first failing part's; features never change it):
#   0 "gpu-check: PASSED"                 every part passed on a GPU
#   2 no GPU: nothing was verified        3 environment: programs, libraries, or a GPU CUDA cannot see
#   4 a test case failed or crashed       5 an expected GPU case did not run
#   6 bench or example failed             7 a sanitizer failed, found errors or ran too few cases
#   8 a phase was stopped by the deadline
set -uo pipefail
start=$SECONDS
root=$(cd "$(dirname "$0")" && pwd)
min_accuracy=${LOCKSTEP_GPU_CHECK_MIN_ACCURACY:-0.80}
mode="" bundle="" out="" recorded=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) mode=bundle; bundle=$(cd "${2:?--bundle needs a folder}" && pwd) || exit 3; shift 2 ;;
    --build) mode=build; shift ;;
    --verdict) mode=verdict; recorded=$(cd "${2:?--verdict needs a folder}" && pwd) || exit 3; shift 2 ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    *) echo "usage: $0 --bundle DIR | --build | --verdict DIR  [--out DIR]" >&2; exit 3 ;;
  esac
done
[ -n "$mode" ] || { echo "usage: $0 --bundle DIR | --build | --verdict DIR  [--out DIR]" >&2; exit 3; }

# The sanitizers' case filters (doctest --test-case) and limits: memcheck over every kernel family
# (elementwise, GEMM, every layer, losses, optimisers, the reducers); racecheck and synccheck over
# the kernels with shared memory and barriers; initcheck over losses, optimisers and reducers.
declare -A san_filter=(
  [memcheck]='gpu: elementwise*,gpu: gemm*,gpu: every layer*,gpu: losses match*,gpu: optimisers*,gpu: softmax*,gpu: the on-device reducer*,gpu: reduce_to_one_device on one GPU*,gpu: ?batch_norm] forward and backward*'
  [racecheck]='gpu: elementwise*,gpu: losses match*,gpu: the on-device reducer*'
  [initcheck]='gpu: losses match*,gpu: optimisers*,gpu: the on-device reducer*,gpu: reduce_to_one_device on one GPU*'
  [synccheck]='gpu: elementwise*,gpu: losses match*'
)
declare -A san_limit=([memcheck]=60 [racecheck]=30 [initcheck]=25 [synccheck]=25)
sanitizers=(memcheck racecheck initcheck synccheck)
# GPU features: a case that tests one names it in brackets ("gpu: [batch_norm] ...").
features=(batch_norm batched_conv no_host_wait graph_capture zero1 weight_copy)
declare -A feature_pattern=([batch_norm]='\[batch_norm\]' [batched_conv]='\[batched_conv\]'
                            [no_host_wait]='\[no_host_wait\]' [graph_capture]='\[graph_capture\]' [zero1]='\[zero1\]'
                            [weight_copy]='\[weight_copy\]')

# ------------------------------------------------------------------------------------------------
# The verdict of the raw logs in folder $1 (see the file comment): prints the verdict lines,
# returns the exit code. Reads only files; the dry run calls it on recorded folders.
# ------------------------------------------------------------------------------------------------
field() { sed -n "s/.*[[:space:]]$1=\\([^[:space:]]*\\).*/\\1/p" | head -n1; }  # value of key=value
rc_of() { if [ -f "$1" ]; then cat "$1"; else echo none; fi; }
nlines() { if [ -f "$1" ]; then grep -c . "$1"; else echo 0; fi; }  # non-empty lines of a file
# A line of a doctest block (from one line of '=' to the next) that makes it a failure.
doctest_failure_re='ERROR:|FATAL ERROR|SIGSEGV|SIGABRT|SIGBUS|SIGFPE|THREW exception'
# The cases that failed in doctest log $1, one name per line: a failing block names its case on
# its "TEST CASE:" line. Under --duration=true every case prints such a header, so a header alone
# is no failure.
failed_cases() {
  awk -v re="$doctest_failure_re" '
       /^=+$/ { if (name != "" && bad) print name; name = ""; bad = 0; next }
       /^TEST CASE:/ { sub(/^TEST CASE: */, ""); name = $0; next }
       $0 ~ re { bad = 1 }
       END { if (name != "" && bad) print name }' "$1" 2>/dev/null | sort -u
}
# Appends " <label>=<ratio>x" to $line: lockstep's samples/s (the first bench.log line starting
# with $3) over PyTorch's (torch.log, $2), from folder $d; n/a with what was missing.
add_ratio() {
  local label=$1 mine theirs
  theirs=$(grep -h "^$2" "$d/torch.log" 2>/dev/null | field samples_per_s)
  mine=$(grep -h "^$3" "$d/bench.log" 2>/dev/null | field samples_per_s)
  if [ -n "$mine" ] && [ -n "$theirs" ]; then line+=" $label=$(awk -v a="$mine" -v b="$theirs" 'BEGIN{printf "%.2f", a/b}')x"
  else line+=" $label=n/a(lockstep ${mine:-none}, torch ${theirs:-none})"; fi
}
verdict() {
  local d=$1 code=0 failed=() line
  set_fail() { [ "$code" -eq 0 ] && code=$1; failed+=("$2"); }
  # environment
  local cuda_devices smi_gpus env_note
  cuda_devices=$(grep -h '^lockstep-env:' "$d/env.log" 2>/dev/null | field devices)
  smi_gpus=$(nlines "$d/gpus.txt")
  if [ -s "$d/missing.txt" ]; then
    echo "environment: FAIL (cannot start the programs: $(cat "$d/missing.txt"))"
    set_fail 3 environment
  elif [ -z "$cuda_devices" ]; then
    echo "environment: FAIL (test_cuda did not report the CUDA environment; see env.log)"
    set_fail 3 environment
  elif [ "$cuda_devices" -eq 0 ] && [ "${smi_gpus:-0}" -gt 0 ]; then
    echo "environment: FAIL (nvidia-smi lists $smi_gpus GPU(s) but CUDA sees none: $(sed -n 's/^lockstep-env: no CUDA device: //p' "$d/env.log" | head -n1))"
    set_fail 3 environment
  elif [ "$cuda_devices" -eq 0 ]; then
    env_note=$(sed -n 's/^lockstep-env: no CUDA device: //p' "$d/env.log" | head -n1)
    echo "environment: FAIL (no GPU: no CUDA device: ${env_note:-CUDA reports 0 devices}; nothing was verified)"
    set_fail 2 "no GPU"
  else
    echo "environment: PASS ($cuda_devices CUDA device(s); $(grep -h '^lockstep-env:' "$d/env.log" | grep -o 'name=[^ ]*' | head -n1))"
  fi
  if [ "$code" -ne 0 ]; then
    echo "gpu-check: FAILED: ${failed[*]} (exit $code)"
    return "$code"
  fi
  # core: every expected GPU case that is not a feature's ran, and none of them failed (a failing
  # feature case is the feature's verdict, not the core's); a crash fails the core.
  local trc expected ran missing nmiss failing failed_list summary_failed all_features
  all_features=$(printf '%s|' "${feature_pattern[@]}"); all_features=${all_features%|}
  trc=$(rc_of "$d/tests.rc")
  expected=0 ran=0 missing=()
  while IFS= read -r name; do
    [ -z "$name" ] && continue
    grep -qiE "$all_features" <<<"$name" && continue
    expected=$((expected + 1))
    if grep -qF "lockstep-gpu-case: ran $name (" "$d/tests.log" 2>/dev/null; then ran=$((ran + 1)); else missing+=("$name"); fi
  done < <(cat "$d/expected-gpu.txt" 2>/dev/null)
  nmiss=${#missing[@]}
  failed_list=$(failed_cases "$d/tests.log")
  listed_failed=$(grep -c . <<<"$failed_list" || true)  # failing blocks in the log
  summary_failed=$(sed -n 's/^\[doctest\] test cases:.*| *\([0-9]*\) failed.*/\1/p' "$d/tests.log" 2>/dev/null | tail -n1)
  failing=$(grep -viE "$all_features" <<<"$failed_list" | grep . | head -n 3 | paste -sd ';' -)
  if [ "$expected" -eq 0 ]; then
    echo "core: FAIL (test_cuda lists no GPU case)"; set_fail 5 core
  elif [ "$trc" = 124 ] || [ "$trc" = 137 ]; then
    echo "core: FAIL (stopped by the deadline after $ran of $expected expected GPU cases)"; set_fail 8 core
  elif ! grep -q '^\[doctest\] test cases:' "$d/tests.log" 2>/dev/null; then
    echo "core: FAIL (test_cuda exit $trc without its summary: a crash after $ran of $expected expected GPU cases; see failures.txt)"
    set_fail 4 core
  elif [ -n "$failing" ]; then
    echo "core: FAIL (failing: $failing; $ran of $expected expected GPU cases ran)"; set_fail 4 core
  elif [ "$trc" != 0 ] && [ "$trc" != 1 ]; then  # doctest exits 1 when cases fail; anything else is a crash
    echo "core: FAIL (test_cuda exit $trc after its summary: a crash at exit; see failures.txt)"
    set_fail 4 core
  elif [ "$trc" != 0 ] && [ -z "$failed_list" ]; then
    echo "core: FAIL (test_cuda exit $trc after its summary, and no failing case in its log: a failure outside the cases; see failures.txt)"
    set_fail 4 core
  elif [ "${summary_failed:-0}" -gt "$listed_failed" ]; then
    echo "core: FAIL (doctest's summary counts $summary_failed failed case(s), the log shows $listed_failed: a failure whose block the log does not hold; see failures.txt)"
    set_fail 4 core
  elif [ "$nmiss" -gt 0 ]; then
    echo "core: FAIL ($nmiss of $expected expected GPU case(s) did not run: $(printf '%s; ' "${missing[@]:0:3}" | sed 's/; $//'))"
    set_fail 5 core
  else
    echo "core: PASS ($ran of $expected expected GPU cases ran, 0 failed)"
  fi
  # bench: exit 0, every figure, every check=pass
  local brc absent bad
  brc=$(rc_of "$d/bench.rc")
  absent=""
  for key in 'gpu_config=L precision=fp32' 'gpu_config=L precision=tf32' 'gpu_config=L precision=bf16' 'gpu_cnn ' \
             'gpu_cnn_bn ' 'gpu_replicas ' 'cublas_sgemm_ceiling ' 'same_device_reducer ' 'device_memcpy_gb_per_s='; do
    grep -q "^$key" "$d/bench.log" 2>/dev/null || absent+=" '${key% }'"
  done
  bad=$(grep -h 'check=' "$d/bench.log" 2>/dev/null | grep -v 'check=pass' | awk '{print $1}' | paste -sd ' ' -)
  if [ "$brc" = 124 ] || [ "$brc" = 137 ]; then
    echo "bench: FAIL (stopped by the deadline)"; set_fail 8 bench
  elif [ "$brc" != 0 ] || [ -n "$absent" ] || [ -n "$bad" ]; then
    echo "bench: FAIL (exit $brc${absent:+; missing:$absent}${bad:+; check mismatch in: $bad})"; set_fail 6 bench
  else
    echo "bench: PASS ($(grep -h '^gpu_config=L precision=fp32' "$d/bench.log" | field samples_per_s) samples/s fp32, every check passed)"
  fi
  # example: exit 0 and the accuracy
  local erc acc
  erc=$(rc_of "$d/example.rc")
  acc=$(sed -n 's/^test_accuracy=\([0-9.]*\).*/\1/p' "$d/example.log" 2>/dev/null | tail -n1)
  if [ "$erc" = 124 ] || [ "$erc" = 137 ]; then
    echo "example: FAIL (stopped by the deadline)"; set_fail 8 example
  elif [ "$erc" != 0 ] || [ -z "$acc" ]; then
    echo "example: FAIL (fashion_mnist_cuda exit $erc, ${acc:+test_accuracy=$acc}${acc:-no test_accuracy line})"; set_fail 6 example
  elif awk -v a="$acc" -v m="$min_accuracy" 'BEGIN { exit !(a + 0 < m + 0) }'; then
    echo "example: FAIL (test_accuracy=$acc below $min_accuracy after one epoch)"; set_fail 6 example
  else
    echo "example: PASS (test_accuracy=$acc >= $min_accuracy after one epoch)"
  fi
  # sanitizers: the filter matched cases, all ran, no error
  local tool src want got errs
  for tool in "${sanitizers[@]}"; do
    src=$(rc_of "$d/$tool.rc")
    want=$(cat "$d/$tool.expected" 2>/dev/null || echo "")
    got=$(grep '^lockstep-gpu-case: ran ' "$d/$tool.log" 2>/dev/null | sort -u | grep -c .)  # distinct cases (subcases repeat)
    errs=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) error.*/\1/p' "$d/$tool.log" 2>/dev/null | tail -n1)
    if [ "$src" = none ] || [ -z "$want" ]; then
      echo "$tool: FAIL (not run$( [ -f "$d/$tool.skip" ] && echo ": $(cat "$d/$tool.skip")"))"; set_fail 7 "$tool"
    elif [ "$want" -eq 0 ]; then
      echo "$tool: FAIL (its case filter matched no case)"; set_fail 7 "$tool"
    elif [ "$src" = 124 ] || [ "$src" = 137 ]; then
      echo "$tool: FAIL (stopped by the deadline; ${got:-0} of $want cases)"; set_fail 8 "$tool"
    elif [ "$src" = 97 ] || [ "${errs:-0}" -gt 0 ]; then
      echo "$tool: FAIL (${errs:-some} error(s) reported; see failures.txt)"; set_fail 7 "$tool"
    elif [ "$src" != 0 ]; then
      echo "$tool: FAIL (exit $src: a case failed or crashed under it; see failures.txt)"; set_fail 7 "$tool"
    elif [ -z "$got" ] || [ "$got" -lt "$want" ]; then
      echo "$tool: FAIL (${got:-0} of the $want cases it was pointed at ran on a GPU)"; set_fail 7 "$tool"
    else
      echo "$tool: PASS ($got of $want cases, 0 errors)"
    fi
  done
  # features of Part B: informational
  local f names fran ffail
  for f in "${features[@]}"; do
    names=$(grep -iE "${feature_pattern[$f]}" "$d/expected-gpu.txt" 2>/dev/null)
    [ -z "$names" ] && continue
    fran=0 ffail=0
    while IFS= read -r name; do
      grep -qF "lockstep-gpu-case: ran $name (" "$d/tests.log" && fran=$((fran + 1))
      grep -qxF "$name" <<<"$failed_list" && ffail=$((ffail + 1))
    done <<<"$names"
    local fn
    fn=$(grep -c . <<<"$names")
    if [ "$fran" -eq "$fn" ] && [ "$ffail" -eq 0 ]; then echo "$f: PASS ($fran case(s))"
    else echo "$f: FAIL ($fran of $fn case(s) ran, $ffail failed)"; fi
  done
  # baseline ratios: informational
  local p
  if [ -s "$d/torch.log" ] && grep -q '^torch_config=L precision=' "$d/torch.log"; then
    line="baseline:"
    for p in fp32 tf32 bf16; do add_ratio "mlp_$p" "torch_config=L precision=$p" "gpu_config=L precision=$p"; done
    add_ratio cnn_fp32 'torch_cnn ' 'gpu_cnn '
    add_ratio cnn_bn_fp32 'torch_cnn_bn ' 'gpu_cnn_bn '
    echo "$line (lockstep samples/s over PyTorch's)"
  else
    echo "baseline: not measured ($(head -n1 "$d/torch.log" 2>/dev/null || echo 'PyTorch not run'))"
  fi
  if [ "$code" -eq 0 ]; then echo "gpu-check: PASSED"
  else echo "gpu-check: FAILED: ${failed[*]} (exit $code)"; fi
  return "$code"
}

if [ "$mode" = verdict ]; then
  verdict "$recorded"
  exit $?
fi

# ------------------------------------------------------------------------------------------------
# A run: raw logs in $work; the four output files in $outdir.
# ------------------------------------------------------------------------------------------------
deadline=$((start + ${LOCKSTEP_GPU_CHECK_DEADLINE:-360}))
core_deadline=$((start + ${LOCKSTEP_GPU_CHECK_CORE_DEADLINE:-240}))
if [ "$mode" = bundle ]; then
  bin="$bundle/bin"; data="$bundle/data/fashion-mnist"; torch_py="$bundle/torch_mlp.py"; base="$bundle"
else
  src=$(cd "$root/.." && pwd)
  build=${LOCKSTEP_GPU_BUILD_DIR:-$src/build-gpu}
  bin="$build/tests/cuda"; data=/usr/share/datasets/fashion-mnist; torch_py="$src/benchmarks/cuda/torch_mlp.py"
  base="$build"
fi
outdir=${out:-${OUT:-$base/gpu-check}}
mkdir -p "$outdir" || exit 3
outdir=$(cd "$outdir" && pwd)
rm -f "$outdir/summary.txt" "$outdir/environment.txt" "$outdir/failures.txt" "$outdir/logs.tar.gz"
work=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-gpu-check.XXXXXX") || exit 3
trap 'rm -rf "$work"' EXIT
phases=()

# summary.txt, environment.txt, failures.txt and logs.tar.gz from what $work holds so far.
publish() {
  {
    echo "lockstep gpu-check ($mode${bundle:+ $bundle}), $((SECONDS - start)) s"
    for p in "${phases[@]}"; do echo "  $p"; done
    [ -f "$work/figures.txt" ] && { echo "figures:"; sed 's/^/  /' "$work/figures.txt"; }
    [ -f "$work/verdict.txt" ] && cat "$work/verdict.txt"
  } >"$outdir/summary.txt"
  {
    cat "$work/gpus.txt" 2>/dev/null | sed 's/^/nvidia-smi: /'
    grep -h '^lockstep-env:' "$work/env.log" 2>/dev/null
    cat "$work/libraries.txt" 2>/dev/null
    echo "LD_LIBRARY_PATH for lockstep's programs: ${lockstep_ld:-}"
    cat "$work/tools.txt" 2>/dev/null
  } >"$outdir/environment.txt"
  {
    for f in "$work"/tests.log "$work"/memcheck.log "$work"/racecheck.log "$work"/initcheck.log "$work"/synccheck.log; do
      [ -f "$f" ] || continue
      awk -v src="$(basename "$f")" -v re="$doctest_failure_re" '
        /^=+$/ { if (block != "" && keep) print "[" src "]\n" block; block = $0 "\n"; keep = 0; next }
        { block = block $0 "\n" }
        $0 ~ re { keep = 1 }
        END { if (block != "" && keep) print "[" src "]\n" block }' "$f"
      grep -h -A12 -E '^========= (Invalid|Uninitialized|Race|Barrier|Error|Program hit)' "$f" 2>/dev/null | head -n 200
    done
    for p in bench example; do
      [ -f "$work/$p.rc" ] && [ "$(cat "$work/$p.rc")" != 0 ] && { echo "[$p.log, last lines]"; tail -n 20 "$work/$p.log"; }
    done
  } >"$outdir/failures.txt" 2>/dev/null
  tar -czf "$outdir/logs.tar.gz" -C "$work" . 2>/dev/null
}
on_signal() { phases+=("stopped from outside after $((SECONDS - start)) s"); publish; exit 8; }
trap on_signal TERM INT

# run <name> <limit-s> <until> <lockstep|other> <command...>: at most min(limit, until - now) s;
# output line-buffered to $work/<name>.log, exit code to $work/<name>.rc.
line_buffered=()
command -v stdbuf >/dev/null 2>&1 && line_buffered=(stdbuf -oL -eL)
run() {
  local name=$1 limit=$2 until=$3 kind=$4
  shift 4
  local left=$((until - SECONDS)) rc=0 t0=$SECONDS
  if [ "$left" -lt 3 ]; then
    phases+=("$name: not run (deadline)"); echo 124 >"$work/$name.rc"; publish; return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  phases+=("$name: running (limit ${limit}s)")
  publish
  if [ "$kind" = lockstep ]; then
    timeout --kill-after=5 "$limit" env LD_LIBRARY_PATH="$lockstep_ld" "${line_buffered[@]}" "$@" >"$work/$name.log" 2>&1 || rc=$?
  else
    timeout --kill-after=5 "$limit" "${line_buffered[@]}" "$@" >"$work/$name.log" 2>&1 || rc=$?
  fi
  echo "$rc" >"$work/$name.rc"
  unset 'phases[${#phases[@]}-1]'
  phases+=("$name: exit $rc after $((SECONDS - t0)) s")
  tail -n 4 "$work/$name.log" | sed 's/^/   /'
  publish
  return "$rc"
}
finish() {  # the verdict of everything recorded, published; exits with its code
  local code=0
  verdict "$work" >"$work/verdict.txt" || code=$?
  publish
  echo
  cat "$work/verdict.txt"
  echo "(files in $outdir)"
  exit "$code"
}

# --- environment ----------------------------------------------------------------------------------
lockstep_ld=""
if [ "$mode" = build ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  for tool in cmake nvcc; do
    command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found" >"$work/missing.txt"; finish; }
  done
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
  case "$arch" in ''|*[!0-9]*) arch=90 ;; esac
  run configure 120 "$core_deadline" other cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" || { echo "configure failed (see configure.log)" >"$work/missing.txt"; finish; }
  run build 240 "$deadline" other cmake --build "$build" -j "$(nproc)" --target test_cuda bench_cuda_mlp fashion_mnist_cuda ||
    { echo "build failed (see build.log)" >"$work/missing.txt"; finish; }
else
  chmod +x "$bin"/* 2>/dev/null  # run bits may not survive the transfer
fi
search_dirs=()
IFS=: read -r -a ld_dirs <<<"${LD_LIBRARY_PATH:-}"
search_dirs+=("${ld_dirs[@]}")
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
  [ -n "$d" ] && search_dirs+=("$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib")
done
if command -v python3 >/dev/null 2>&1; then
  while IFS= read -r d; do search_dirs+=("$d"); done < <(timeout 20 python3 -c '
import glob, os, sys
for p in sys.path:
    for d in sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib")) + glob.glob(os.path.join(p, "nvidia", "*", "lib64"))):
        print(d)' 2>/dev/null)
fi
found_dirs=()
for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  where=""
  for d in "${search_dirs[@]}"; do
    if [ -n "$d" ] && [ -e "$d/$lib" ]; then where=$d; break; fi
  done
  if [ -n "$where" ]; then
    echo "library $lib: $where/$lib" >>"$work/libraries.txt"
    case " ${found_dirs[*]} " in *" $where "*) ;; *) found_dirs+=("$where") ;; esac
  else
    echo "library $lib: not found (searched LD_LIBRARY_PATH, the CUDA toolkit's folders, python3's nvidia/*/lib)" >>"$work/libraries.txt"
  fi
done
lockstep_ld=$(IFS=:; echo "${found_dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
: >"$work/missing.txt"
for p in test_cuda bench_cuda_mlp fashion_mnist_cuda; do
  if [ ! -x "$bin/$p" ]; then echo -n " $p(absent)" >>"$work/missing.txt"; continue; fi
  LD_LIBRARY_PATH="$lockstep_ld" ldd "$bin/$p" >"$work/ldd-$p.txt" 2>&1
  nf=$(grep 'not found' "$work/ldd-$p.txt" | awk '{print $1}' | paste -sd ' ' -)
  [ -n "$nf" ] && echo -n " $p(needs $nf)" >>"$work/missing.txt"
done
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 20 nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader \
    >"$work/gpus.txt" 2>"$work/nvidia-smi.err" || : >"$work/gpus.txt"
else
  : >"$work/gpus.txt"
  echo "nvidia-smi: not found" >>"$work/tools.txt"
fi
sanitizer=$(command -v compute-sanitizer 2>/dev/null || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | head -n1)
echo "compute-sanitizer: ${sanitizer:-not found}${sanitizer:+ ($("$sanitizer" --version 2>/dev/null | tail -n1))}" >>"$work/tools.txt"
if command -v python3 >/dev/null 2>&1; then
  echo "python3: $(python3 --version 2>&1); torch: $(timeout 30 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n1)" >>"$work/tools.txt"
else
  echo "python3: not found" >>"$work/tools.txt"
fi
[ "$mode" = bundle ] && [ -f "$bundle/MANIFEST.txt" ] && head -n 4 "$bundle/MANIFEST.txt" | sed 's/^/bundle: /' >>"$work/tools.txt"
[ -s "$work/missing.txt" ] && finish
run env 30 "$core_deadline" lockstep "$bin/test_cuda" --test-case='host: the CUDA driver*' --no-colors
gpus=$(grep -h '^lockstep-env:' "$work/env.log" | field devices)
[ "${gpus:-0}" -ge 1 ] || finish  # no GPU (or one CUDA cannot see): the verdict says which

# --- core: tests, benchmark, example (verdict within the core deadline) ---------------------------
filter='gpu: *'
[ "$gpus" -ge 2 ] && filter='gpu: *,multigpu: *'
LD_LIBRARY_PATH="$lockstep_ld" "$bin/test_cuda" --list-test-cases --test-case="$filter" --no-colors 2>/dev/null |
  grep -E '^(gpu|multigpu): ' >"$work/expected-gpu.txt"
run tests 150 "$core_deadline" lockstep "$bin/test_cuda" --duration=true --no-colors
run bench 60 "$core_deadline" lockstep "$bin/bench_cuda_mlp"
run example 45 "$core_deadline" lockstep "$bin/fashion_mnist_cuda" --device gpu --epochs 1 --quiet --data "$data"
grep -hE '^(device|gpu_config|gpu_cnn|gpu_replicas|cublas|same_device_reducer|device_memcpy)' "$work/bench.log" >"$work/figures.txt" 2>/dev/null
grep -h '^test_accuracy=' "$work/example.log" 2>/dev/null | sed 's/^/fashion_mnist gpu: /' >>"$work/figures.txt"
verdict "$work" | grep -E '^(environment|core|bench|example):' >"$work/verdict.txt"
publish
echo
cat "$work/figures.txt" "$work/verdict.txt"

# --- extras: the PyTorch baseline, then compute-sanitizer -----------------------------------------
if command -v python3 >/dev/null 2>&1 && [ -f "$torch_py" ]; then
  run torch 60 "$deadline" other python3 "$torch_py"
else
  echo "PyTorch not run: python3 or $torch_py missing" >"$work/torch.log"
fi
export LOCKSTEP_TEST_TIMEOUT_SCALE=30  # the tests' collective timeouts, under a sanitizer
for tool in "${sanitizers[@]}"; do
  LD_LIBRARY_PATH="$lockstep_ld" "$bin/test_cuda" --list-test-cases --test-case="${san_filter[$tool]}" --no-colors 2>/dev/null |
    grep -c '^gpu: ' >"$work/$tool.expected"
  if [ -z "$sanitizer" ]; then
    echo "compute-sanitizer not found" >"$work/$tool.skip"
    continue
  fi
  run "$tool" "${san_limit[$tool]}" "$deadline" lockstep "$sanitizer" --tool "$tool" \
    --error-exitcode 97 --print-limit 20 "$bin/test_cuda" --test-case="${san_filter[$tool]}" --no-colors
done
finish
