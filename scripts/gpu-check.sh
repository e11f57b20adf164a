#!/usr/bin/env bash
# Runs lockstep's GPU tests, benchmarks and sanitizer checks on a machine with a CUDA GPU and gives
# a verdict that cannot pass falsely. Works offline: no apt, no pip, no network.
#
#   scripts/gpu-check.sh --bundle DIR   runs the programs of a bundle made by scripts/gpu-bundle.sh
#                                       (no compiler or CMake needed; the usual way)
#   scripts/gpu-check.sh --build        fallback: builds test_cuda, bench_cuda_mlp and
#                                       fashion_mnist_cuda here with CMake and nvcc first
#                                       (LOCKSTEP_GPU_BUILD_DIR, default build-gpu)
#
# One deadline: the whole check ends within 420 s (LOCKSTEP_GPU_CHECK_DEADLINE to change it); each
# phase gets at most its own limit and what is left. Every phase's full log and summary.txt
# (rewritten after every phase, so a killed run still explains itself) go to $OUT/gpu-check when
# OUT is set, otherwise to <bundle or build folder>/gpu-check.
#
# cuBLAS and NCCL are looked up, in this order, in: the folders of LD_LIBRARY_PATH; the CUDA
# toolkit's library folders ($CUDA_HOME/lib64, /usr/local/cuda/lib64, /usr/local/cuda-*/lib64 and
# their targets/x86_64-linux/lib); the nvidia/*/lib folders of the Python packages of python3
# (PyTorch's pip dependencies such as nvidia-cublas and nvidia-nccl). What was found is reported
# and put first on LD_LIBRARY_PATH.
#
# Phases: environment, tests (every doctest case of test_cuda, failures printed in full), bench
# (bench_cuda_mlp), fashion (one epoch of Fashion-MNIST on the GPU), torch (PyTorch on the same
# MLP, when importable), memcheck and racecheck (compute-sanitizer on the reducer tests).
# Exit code and last line:
#   0 "gpu-check: PASSED ..."                     every phase passed, GPU tests ran on a GPU
#   2 "gpu-check: FAILED: no GPU: not verified"   no usable CUDA device (nothing was verified)
#   3 "... environment: ..."                      programs or libraries missing
#   4 "... tests failed ..."                      a test case failed or test_cuda crashed
#   5 "... no test ran on a GPU ..."              GPU cases were skipped ("no CUDA device") or none ran
#   6 "... benchmark printed no figure ..."       bench or fashion did not print its figures
#   7 "... sanitizer ..."                         compute-sanitizer reported errors or is missing
#   8 "... deadline ..."                          a phase was stopped by the deadline
set -uo pipefail
start=$SECONDS
deadline=$((start + ${LOCKSTEP_GPU_CHECK_DEADLINE:-420}))
root=$(cd "$(dirname "$0")" && pwd)
mode="" bundle=""
case "${1:-}" in
  --bundle) mode=bundle; bundle=$(cd "${2:?--bundle needs a folder}" && pwd) ;;
  --build) mode=build ;;
  *) echo "usage: $0 --bundle DIR | --build" >&2; exit 3 ;;
esac

if [ "$mode" = bundle ]; then
  bin="$bundle/bin"; data="$bundle/data/fashion-mnist"; torch_py="$bundle/torch_mlp.py"; base="$bundle"
else
  src=$(cd "$root/.." && pwd)
  build=${LOCKSTEP_GPU_BUILD_DIR:-$src/build-gpu}
  bin="$build/tests/cuda"; data=/usr/share/datasets/fashion-mnist; torch_py="$src/benchmarks/cuda/torch_mlp.py"
  base="$build"
fi
logs="${OUT:-$base}/gpu-check"
mkdir -p "$logs"
summary="$logs/summary.txt"

declare -A status
order=()
notes=()
codes=()     # exit codes of failures, first one wins
reasons=()

write_summary() {  # summary.txt: phases so far, notes, and the verdict line when known
  {
    echo "lockstep gpu-check ($mode${bundle:+ $bundle}), $((SECONDS - start)) s of $((deadline - start)) s"
    for p in "${order[@]}"; do printf '%-12s %s\n' "$p" "${status[$p]}"; done
    for n in "${notes[@]}"; do echo "$n"; done
    [ -n "${1:-}" ] && echo "$1"
  } >"$summary"
}
fail() { codes+=("$1"); reasons+=("$2"); }
finish() {
  local line code=0
  if [ ${#codes[@]} -eq 0 ]; then
    line="gpu-check: PASSED (logs in $logs)"
  else
    code=${codes[0]}
    local joined
    joined=$(printf '%s; ' "${reasons[@]}")
    line="gpu-check: FAILED: ${joined%; } (logs in $logs)"
  fi
  write_summary "$line"
  echo
  cat "$summary"
  exit "$code"
}
on_signal() { fail 8 "deadline: the check was stopped from outside"; finish; }
trap on_signal TERM INT

# phase <name> <limit-s> <command...>: runs with min(limit, time left - 5 s), full log in $logs/<name>.log
phase() {
  local name=$1 limit=$2
  shift 2
  local left=$((deadline - SECONDS - 5))
  order+=("$name")
  if [ "$left" -lt 5 ]; then
    status[$name]="not run: deadline"
    fail 8 "deadline: no time left for $name"
    write_summary
    return 99
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s)"
  status[$name]="running since $((SECONDS - start)) s, limit ${limit}s"
  write_summary  # a run killed during this phase still says where it was
  local rc=0
  timeout --kill-after=5 "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status[$name]="stopped after ${limit}s"
    fail 8 "deadline: $name stopped after ${limit}s"
  elif [ "$rc" -eq 0 ]; then
    status[$name]=ok
  else
    status[$name]="exit $rc"
  fi
  tail -n 8 "$logs/$name.log" | sed 's/^/   /'
  write_summary
  return "$rc"
}

# --- environment ------------------------------------------------------------------------------
order+=(environment)
status[environment]=checking
write_summary
if [ "$mode" = build ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  for tool in cmake nvcc; do
    command -v "$tool" >/dev/null 2>&1 || { status[environment]="missing $tool"; fail 3 "environment: $tool not found"; finish; }
  done
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')
  case "$arch" in ''|*[!0-9]*) arch=90 ;; esac
  phase configure 120 cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" || { fail 3 "environment: configure failed (see configure.log)"; finish; }
  phase build 240 cmake --build "$build" -j "$(nproc)" --target test_cuda bench_cuda_mlp fashion_mnist_cuda ||
    { fail 3 "environment: build failed (see build.log)"; finish; }
fi

# The shared libraries the programs need but that do not travel with them.
search_dirs=()
IFS=: read -r -a ld_dirs <<<"${LD_LIBRARY_PATH:-}"
search_dirs+=("${ld_dirs[@]}")
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
  [ -n "$d" ] && search_dirs+=("$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib")
done
if command -v python3 >/dev/null 2>&1; then
  while IFS= read -r d; do search_dirs+=("$d"); done < <(timeout 30 python3 -c '
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
    notes+=("library $lib: $where/$lib")
    case " ${found_dirs[*]} " in *" $where "*) ;; *) found_dirs+=("$where") ;; esac
  else
    notes+=("library $lib: not found (searched LD_LIBRARY_PATH, CUDA toolkit folders, python3's nvidia/*/lib)")
  fi
done
if [ ${#found_dirs[@]} -gt 0 ]; then
  LD_LIBRARY_PATH=$(IFS=:; echo "${found_dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
fi
missing=""
for p in test_cuda bench_cuda_mlp fashion_mnist_cuda; do
  if [ ! -x "$bin/$p" ]; then missing+=" $p(absent)"; continue; fi
  ldd "$bin/$p" >"$logs/ldd-$p.txt" 2>&1
  nf=$(grep 'not found' "$logs/ldd-$p.txt" | awk '{print $1}' | tr '\n' ' ')
  [ -n "$nf" ] && missing+=" $p(needs ${nf% })"
done
if [ -n "$missing" ]; then
  status[environment]="missing:$missing"
  fail 3 "environment: cannot start the programs:$missing"
  finish
fi
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader \
    >"$logs/gpus.txt" 2>&1 && gpus=$(grep -c . "$logs/gpus.txt")
  notes+=("gpus: $gpus ($(head -n1 "$logs/gpus.txt"))")
else
  notes+=("gpus: nvidia-smi not found")
fi
status[environment]="ok (programs start; $gpus GPU(s) listed)"
write_summary

# --- tests --------------------------------------------------------------------------------------
# Every case prints its duration (so a crash names the case after the last one listed); a failing
# case prints its assertions, INFO and CAPTURE values in full.
phase tests 120 "$bin/test_cuda" --duration=true --no-colors
trc=$?
tlog="$logs/tests.log"
no_device=$(grep -c 'skipped: no CUDA device' "$tlog")
needs_more=$(grep -c 'skipped: needs [0-9]* CUDA devices' "$tlog")
ran_gpu=$(grep -c '^lockstep-gpu-case: ran' "$tlog")
tline=$(grep -E '^\[doctest\] test cases:' "$tlog" | tail -n1)
notes+=("tests: ${tline:-no doctest summary} | ran on a GPU: $ran_gpu | skipped, no CUDA device: $no_device | skipped, need more GPUs: $needs_more")
if [ "$trc" -ne 0 ] && [ "$trc" -ne 124 ] && [ "$trc" -ne 137 ]; then
  fail 4 "tests failed (test_cuda exit $trc; see tests.log)"
fi
if [ "$no_device" -gt 0 ] || { [ "$ran_gpu" -eq 0 ] && [ "$gpus" -eq 0 ]; }; then
  status[tests]="${status[tests]}, $no_device case(s) skipped: no CUDA device"
  codes=(2 "${codes[@]}")
  reasons=("no GPU: not verified" "${reasons[@]}")
  finish
fi
[ "$ran_gpu" -gt 0 ] || fail 5 "no test ran on a GPU"
write_summary

# --- benchmarks ---------------------------------------------------------------------------------
phase bench 90 "$bin/bench_cuda_mlp"
for key in gpu_config=L cublas_sgemm_ceiling same_device_reducer device_memcpy_gb_per_s; do
  grep -q "$key" "$logs/bench.log" || fail 6 "benchmark printed no figure ($key missing in bench.log)"
done
while IFS= read -r l; do notes+=("$l"); done < <(grep -E '^(device|gpu_config|cublas|same_device_reducer|device_memcpy)' "$logs/bench.log")

phase fashion 60 "$bin/fashion_mnist_cuda" --device gpu --epochs 1 --quiet --data "$data"
frc=$?
fres=$(grep -E '^test_accuracy=' "$logs/fashion.log" | tail -n1)
if [ "$frc" -ne 0 ] || [ -z "$fres" ]; then
  fail 6 "benchmark printed no figure (fashion_mnist_cuda exit $frc, no test_accuracy line)"
else
  notes+=("fashion_mnist gpu: $fres")
fi

if command -v python3 >/dev/null 2>&1 && timeout 30 python3 -c 'import torch' >/dev/null 2>&1; then
  phase torch 45 python3 "$torch_py"
  while IFS= read -r l; do notes+=("$l"); done < <(grep -E '^torch_config' "$logs/torch.log")
else
  notes+=("torch_config=L not measured: python3 cannot import torch")
fi

# --- compute-sanitizer on the reducer tests -----------------------------------------------------
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
# The reducer cases that check exact sums and the release of peers (not the 20-step training runs,
# which the sanitizers would slow beyond the deadline).
reducer_cases='*in replica order*'
if [ -z "$sanitizer" ]; then
  fail 7 "sanitizer: compute-sanitizer not found"
else
  for tool in memcheck racecheck; do
    phase "$tool" 90 "$sanitizer" --tool "$tool" --error-exitcode 97 --print-limit 20 \
      "$bin/test_cuda" --test-case="$reducer_cases" --no-colors
    src=$?
    [ "$src" -eq 97 ] && fail 7 "sanitizer: $tool reported errors (see $tool.log)"
    [ "$src" -ne 0 ] && [ "$src" -ne 97 ] && [ "$src" -ne 124 ] && [ "$src" -ne 137 ] &&
      fail 7 "sanitizer: $tool run failed (exit $src)"
  done
fi
finish
