#!/usr/bin/env bash
# Builds and runs lockstep's GPU tests and GPU benchmarks on a machine with a CUDA GPU, in one
# command, and prints a summary (tests passed / failed / skipped, gpu_config=L throughput,
# CUB reduction against the device's copy bandwidth, and PyTorch on the same MLP when present).
# Works offline with what is installed; says clearly what is missing. Each phase has a timeout,
# and the summary is printed even when a phase fails. Exit code: 0 when every phase passed.
#
#   scripts/gpu-check.sh            (LOCKSTEP_GPU_BUILD_DIR=... to choose the build directory)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${LOCKSTEP_GPU_BUILD_DIR:-build-gpu}
log_dir="$build/gpu-check-logs"
mkdir -p "$log_dir"
jobs=$(nproc 2>/dev/null || echo 2)
export PATH="$PATH:/usr/local/cuda/bin"

declare -A status
summary_lines=()
failed=0

phase() {  # phase <name> <timeout-seconds> <command...>: runs with a timeout, logs, records status
  local name=$1 limit=$2
  shift 2
  echo "== $name (timeout ${limit}s)"
  local rc=0
  timeout --kill-after=10 "$limit" "$@" >"$log_dir/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    status[$name]=ok
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status[$name]="timed out after ${limit}s"
    failed=1
  else
    status[$name]="failed (exit $rc)"
    failed=1
  fi
  tail -n 15 "$log_dir/$name.log" | sed 's/^/   /'
  return 0
}

print_summary() {
  echo
  echo "================ lockstep gpu-check summary ================"
  for p in environment configure build tests bench torch; do
    [ -n "${status[$p]:-}" ] && printf '%-12s %s\n' "$p" "${status[$p]}"
  done
  for l in "${summary_lines[@]}"; do echo "$l"; done
  echo "============================================================"
}
trap print_summary EXIT

# --- environment: what is there and what is missing ---------------------------------------
# Headers are looked up by the compiler itself (Debian keeps cblas.h in a multiarch folder).
has_header() { printf '#include <%s>\n' "$1" | g++ -std=c++20 -fsyntax-only -x c++ - >/dev/null 2>&1; }
find_missing() {
  missing=()
  for tool in cmake nvcc g++; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  if command -v g++ >/dev/null 2>&1; then
    for hdr in doctest/doctest.h cblas.h fmt/core.h zlib.h; do has_header "$hdr" || missing+=("<$hdr>"); done
  fi
}
find_missing
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "== trying to install missing Debian packages (${missing[*]})"
  timeout 180 apt-get install -y --no-install-recommends cmake g++ doctest-dev libopenblas-dev libfmt-dev \
    zlib1g-dev libcli11-dev >"$log_dir/apt.log" 2>&1 ||
    { timeout 60 apt-get update >>"$log_dir/apt.log" 2>&1 &&
      timeout 180 apt-get install -y --no-install-recommends cmake g++ doctest-dev libopenblas-dev libfmt-dev \
        zlib1g-dev libcli11-dev >>"$log_dir/apt.log" 2>&1; } || echo "   apt-get failed (no network?), see $log_dir/apt.log"
  find_missing
fi
if [ ${#missing[@]} -gt 0 ]; then
  status[environment]="missing: ${missing[*]}"
  summary_lines+=("cannot build: missing ${missing[*]} (install cmake g++ doctest-dev libopenblas-dev libfmt-dev zlib1g-dev)")
  exit 1
fi
arch=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap --format=csv,noheader \
    >"$log_dir/gpus.txt" 2>&1 || true
  arch=$(head -n1 "$log_dir/gpus.txt" | awk -F', ' '{print $5}' | tr -d '.' || true)
  summary_lines+=("gpus: $(wc -l <"$log_dir/gpus.txt") ($(head -n1 "$log_dir/gpus.txt"))")
else
  summary_lines+=("gpus: nvidia-smi not found")
fi
case "$arch" in ''|*[!0-9]*) arch="80;90" ;; esac
status[environment]="ok (nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), CUDA architectures $arch)"

# --- configure and build only the GPU targets -----------------------------------------------
phase configure 120 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DLOCKSTEP_BUILD_EXAMPLES=OFF
if [ "${status[configure]}" = ok ]; then
  phase build 300 cmake --build "$build" --target test_cuda bench_cuda_mlp -j "$jobs"
fi

# --- tests ------------------------------------------------------------------------------------
if [ "${status[build]:-}" = ok ]; then
  phase tests 180 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120
  log="$log_dir/tests.log"
  passed=$(grep -cE 'Test +#[0-9]+: .* Passed' "$log" || true)
  skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$log" || true)
  tfailed=$(grep -cE 'Test +#[0-9]+: .*(Failed|Exception|Timeout|Not Run)' "$log" || true)
  summary_lines+=("tests passed=$passed failed=$tfailed skipped=$skipped")
  if [ "$skipped" -gt 0 ]; then
    summary_lines+=("skip reasons: $(grep -ho 'skipped: [^"]*' "$log" | sort | uniq -c | tr '\n' ';' | head -c 300)")
  fi

  # --- benchmarks ---------------------------------------------------------------------------
  phase bench 120 "$build/tests/cuda/bench_cuda_mlp"
  while IFS= read -r l; do summary_lines+=("$l"); done < <(grep -E '^(device|gpu_config|cub_reduce|device_memcpy|skipped)' "$log_dir/bench.log" || true)
fi

# --- PyTorch on the same MLP, when it is installed ------------------------------------------
if command -v python3 >/dev/null 2>&1 && python3 -c 'import torch' >/dev/null 2>&1; then
  phase torch 120 python3 "$root/benchmarks/cuda/torch_mlp.py"
  while IFS= read -r l; do summary_lines+=("$l"); done < <(grep -E '^torch_config' "$log_dir/torch.log" || true)
else
  summary_lines+=("torch_config=L skipped: python3 with torch not found")
fi

exit "$failed"
