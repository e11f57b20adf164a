#!/usr/bin/env bash
# Runs lockstep's benchmarks and the same work in TensorFlow, PyTorch and dlib ("peers") in one
# run, and writes docs/benchmarks.md: the page's text (benchmarks/report/benchmarks.md.in) with the
# side-by-side tables of this run inserted (benchmarks/report/make_report.py) and drawn as bar
# charts of their ratios in docs/img (benchmarks/report/charts.py).
#
#   benchmarks/run.sh [--quick] [--skip-peers] [--build DIR] [--host-gemm onednn|openblas]
#                     [--openblas-coretype auto|keep|NAME] [--out FILE]
#
#   --quick        few repeats, 1 epoch: checks the plumbing in a few minutes; its figures mean
#                  nothing, and it writes build/benchmarks-quick.md instead of docs/benchmarks.md
#   --skip-peers   lockstep only (the peers' columns say "skipped")
#   --build DIR    build folder (default build-bench), configured Release
#   --host-gemm    lockstep's host GEMM (default: onednn where libdnnl is installed, else openblas)
#   --openblas-coretype  OpenBLAS kernel set for every program of the run. auto (default): where
#                  OpenBLAS falls back to a generic set (Prescott, Core2, ...) on a CPU with AVX-512
#                  or AVX2, SkylakeX or Haswell; keep: OpenBLAS's own choice; NAME: that set
#   --out FILE     where the page goes
#
# The peers are installed by benchmarks/peers/setup.sh (run here unless --skip-peers); one that
# cannot be installed is skipped with its reason. Everything runs one program at a time; results
# and logs go to DIR/bench-results/. A full run takes about 12-15 minutes on 2 cores, a few more
# the first time (the peers' installation and lockstep's build).
# FILE is written (and its charts redrawn) only when lockstep's build and every one of its
# benchmarks succeeded; otherwise the run exits 1 naming the failed steps and leaves FILE as it
# was (a failed build stops the run; after a failed benchmark the page of the run is written to
# DIR/bench-results/benchmarks.md). A peer's failure shows in its cells and does not fail the run;
# the benchmarks of optional components (images, MPI) are skipped when the component is absent.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
quick=0 skip_peers=0 build=build-bench host_gemm=auto coretype=auto out=""
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --skip-peers) skip_peers=1 ;;
    --build) build=$2; shift ;;
    --host-gemm) host_gemm=$2; shift ;;
    --openblas-coretype) coretype=$2; shift ;;
    --out) out=$2; shift ;;
    -h|--help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$out" ]; then
  if ((quick)); then out=build/benchmarks-quick.md; else out=docs/benchmarks.md; fi
fi
if [ "$host_gemm" = auto ]; then
  if ls /usr/lib/*/libdnnl.so* >/dev/null 2>&1 || ls /usr/local/lib*/libdnnl.so* >/dev/null 2>&1; then host_gemm=onednn; else host_gemm=openblas; fi
fi
results=$build/bench-results
rm -rf "$results"
mkdir -p "$results" "$(dirname "$out")"
start=$(date +%s)
log() { echo "[run.sh $(($(date +%s) - start))s] $*" >&2; }

# run NAME CMD...: runs CMD with stdout+stderr in $results/NAME.log, and records the command, its
# exit status and its wall seconds in $results/commands.tsv. A failed build_* or ours_* step is
# added to `failed` (but for build_images: the image component is optional); the peers' steps
# fail softly: their cells say so.
failed=()
run() {
  local name=$1; shift
  log "$name: $*"
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$@" >"$results/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')" \
    "$(printf '%q ' "${env_prefix[@]}" "$@" | sed 's/ $//')" >>"$results/commands.tsv"
  if ((rc != 0)); then
    log "$name: exit status $rc (see $results/$name.log)"
    case $name in
      build_images) ;;  # the image component may be absent (its steps are then skipped, below)
      build* | ours_*) failed+=("$name") ;;
    esac
  fi
  return 0
}
env_prefix=()

# --- build --------------------------------------------------------------------------------------
log "building lockstep (Release, LOCKSTEP_HOST_GEMM=$host_gemm) in $build"
targets=(bench_step bench_update bench_conv bench_scaling bench_allreduce bench_pipeline bench_gemm bench_fma fashion_mnist)
run build_configure cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=OFF -DLOCKSTEP_BUILD_TESTS=OFF \
  -DLOCKSTEP_FUZZ=OFF -DLOCKSTEP_HOST_GEMM="$host_gemm"
run build cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
# The image benchmark needs the image component (libpng, libjpeg-turbo, which scripts/deps.sh
# installs); without it the images rows say that their step failed.
run build_images cmake --build "$build" -j "$(nproc)" --target bench_images
for t in "${targets[@]}"; do
  [ -x "$build/benchmarks/$t" ] || [ -x "$build/examples/$t" ] || log "$t was not built (see $results/build.log)"
done
if ((${#failed[@]})); then
  log "FAILED: ${failed[*]} (logs in $results); $out is left as it was"
  exit 1
fi
b=$build/benchmarks

# --- machine and OpenBLAS kernel set --------------------------------------------------------------
{
  echo "cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1 | tr ' ' '_')"
  echo "cpus=$(nproc)"
  echo "cpu_mhz=$(sed -n 's/^cpu MHz[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  echo "lscpu_max_mhz=$(LC_ALL=C lscpu 2>/dev/null | sed -n 's/^CPU max MHz:[[:space:]]*//p')"
  echo "flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n 1 | tr ' ' ',')"
  echo "compiler=$(g++ --version | head -n 1 | tr ' ' '_')"
  echo "openblas_package=$(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo unknown)"
  echo "onednn_package=$(dpkg-query -W -f='${Version}' libdnnl2 2>/dev/null || echo none)"
  echo "quick=$quick"
} >"$results/machine.txt"
auto_core=$("$b/bench_gemm" --repeats 1 --shape 64x64x64 2>/dev/null | sed -n 's/.*openblas_core=\([^ ]*\).*/\1/p')
echo "openblas_auto_core=${auto_core:-unknown}" >>"$results/machine.txt"
flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
case $coretype in
  keep) coretype="" ;;
  auto)
    coretype=""
    # A kernel set the machine already chose (some OpenBLAS builds crash on some CPUs) stays.
    [ -n "${OPENBLAS_CORETYPE:-}" ] && auto_core=kept
    case $auto_core in
      Prescott|Core2|Penryn|Dunnington|Nehalem|Atom|Katmai|Coppermine|Northwood|Banias|unknown|"")
        if [[ " $flags " == *" avx512f "* ]]; then coretype=SkylakeX
        elif [[ " $flags " == *" avx2 "* ]]; then coretype=Haswell; fi ;;
    esac ;;
esac
if [ -n "$coretype" ]; then
  export OPENBLAS_CORETYPE=$coretype
  env_prefix=(OPENBLAS_CORETYPE=$coretype)
  log "OpenBLAS picks $auto_core here: every program runs with OPENBLAS_CORETYPE=$coretype"
fi
echo "openblas_coretype=${coretype:-}" >>"$results/machine.txt"
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi_env=()
[ -n "$coretype" ] && mpi_env=(-x OPENBLAS_CORETYPE)

# --- lockstep -----------------------------------------------------------------------------------
if ((quick)); then
  reps_step=3 reps_gemm=3 conv_steps=2 pipe_epochs=1 epochs=1
else
  reps_step=0 reps_gemm=30 conv_steps=11 pipe_epochs=5 epochs=20
fi
step_args=(); ((reps_step)) && step_args=(--repeats "$reps_step")
run ours_fma "$b/bench_fma"
run ours_gemm "$b/bench_gemm" --repeats "$reps_gemm" --shape 1024x1024x1024 --shape 2048x1024x1024
run ours_step "$b/bench_step" "${step_args[@]}"
run ours_update "$b/bench_update"
run ours_conv "$b/bench_conv" --only-step --steps "$conv_steps"
run ours_scaling "$b/bench_scaling"
# The MPI lines and the image benchmark need optional components: without them their steps are
# skipped (their cells say "not run"); with them a failure fails the run like any other.
have_mpi=0; command -v mpirun >/dev/null 2>&1 && have_mpi=1
((have_mpi)) || log "ours_*_mpi skipped: no mpirun (Debian's openmpi-bin)"
((have_mpi)) && run ours_scaling_mpi mpirun "${mpi_env[@]}" -np 2 "$b/bench_scaling"
run ours_allreduce "$b/bench_allreduce"
((have_mpi)) && run ours_allreduce_mpi mpirun "${mpi_env[@]}" -np 2 "$b/bench_allreduce"
run ours_pipeline "$b/bench_pipeline" --epochs "$pipe_epochs"
images_dir=$build/bench-images
if [ -x "$b/bench_images" ]; then
  run ours_images_write "$b/bench_images" --write "$images_dir"
  run ours_images "$b/bench_images" --dir "$images_dir" --epochs "$pipe_epochs"
else
  log "ours_images skipped: bench_images was not built (the image component needs libpng and libjpeg-turbo)"
fi
run ours_mainjob "$build/examples/fashion_mnist" --quiet --epochs "$epochs"
run ours_mainjob_unsharded "$build/examples/fashion_mnist" --quiet --epochs "$epochs" --no-shard-optimizer
run ours_cnn_epoch "$build/examples/fashion_mnist" --quiet --model cnn --epochs 1 --batch 128
# compile_cost.sh measures under /usr/bin/time (Debian's `time`), installed here when missing.
if ! [ -x /usr/bin/time ]; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  log "installing Debian's time for benchmarks/compile_cost.sh"
  { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends time; } \
    >"$results/time_install.log" 2>&1 || log "apt-get install time failed (see $results/time_install.log)"
fi
if [ -x /usr/bin/time ]; then
  run ours_compile benchmarks/compile_cost.sh
else
  log "ours_compile skipped: /usr/bin/time could not be installed (see $results/time_install.log)"
fi

# --- peers --------------------------------------------------------------------------------------
if ((skip_peers)); then
  echo "peer=all status=skipped reason=--skip-peers" >"$results/peers.status"
else
  venv=${LOCKSTEP_PEERS_VENV:-build/peers-venv}
  log "installing the peers (benchmarks/peers/setup.sh)"
  LOCKSTEP_PEERS_VENV=$venv benchmarks/peers/setup.sh >"$results/peers_setup.log" 2>&1 ||
    log "benchmarks/peers/setup.sh failed (see $results/peers_setup.log)"
  cp "$venv/peers.status" "$results/peers.status" 2>/dev/null ||
    echo "peer=all status=skipped reason=setup.sh_wrote_no_status" >"$results/peers.status"
  peer_python() { sed -n "s/^peer=$1 status=ok.* python=\([^ ]*\).*/\1/p" "$results/peers.status"; }
  tf_py=$(peer_python tensorflow) torch_py=$(peer_python pytorch)
  if ((quick)); then
    pr=(--repeats 2) mr=(--repeats 2 --steps 8) ar=(--repeats 3)
  else
    pr=(--repeats 10) mr=(--repeats 8 --steps 40) ar=(--repeats 10)
  fi
  export TF_CPP_MIN_LOG_LEVEL=2
  if [ -n "$tf_py" ]; then
    for c in S M L cnn; do run "tf_step_$c" "$tf_py" benchmarks/peers/tf_bench.py step --config "$c" "${pr[@]}"; done
    for c in S M L cnn; do
      run "tf_step_${c}_bf16" "$tf_py" benchmarks/peers/tf_bench.py step --config "$c" --precision bf16 "${pr[@]}"
    done
    for r in 1 2; do run "tf_mirrored_$r" "$tf_py" benchmarks/peers/tf_bench.py mirrored --replicas "$r" "${mr[@]}"; done
    run tf_pipeline "$tf_py" benchmarks/peers/tf_bench.py pipeline --epochs "$pipe_epochs"
    run tf_images "$tf_py" benchmarks/peers/tf_images.py --dir "$images_dir" --epochs "$pipe_epochs"
    for m in one mirrored; do run "tf_mainjob_$m" "$tf_py" benchmarks/peers/tf_bench.py mainjob --mode "$m" --epochs "$epochs"; done
    run tf_mainjob_cnn "$tf_py" benchmarks/peers/tf_bench.py mainjob --mode one --model cnn --epochs 1
  fi
  if [ -n "$torch_py" ]; then
    for c in S M L cnn; do run "torch_step_$c" "$torch_py" benchmarks/peers/torch_bench.py step --config "$c" "${pr[@]}"; done
    for c in S M L cnn; do
      run "torch_step_${c}_bf16" "$torch_py" benchmarks/peers/torch_bench.py step --config "$c" --precision bf16 "${pr[@]}"
    done
    for r in 1 2; do run "torch_ddp_$r" "$torch_py" benchmarks/peers/torch_bench.py ddp --replicas "$r" "${mr[@]}"; done
    for m in 16 64; do run "torch_allreduce_$m" "$torch_py" benchmarks/peers/torch_bench.py allreduce --mib "$m" "${ar[@]}"; done
    run torch_mainjob "$torch_py" benchmarks/peers/torch_bench.py mainjob --epochs "$epochs"
  fi
  if grep -q "^peer=dlib status=ok" "$results/peers.status"; then
    run dlib_compile benchmarks/peers/dlib_compile_cost.sh
  fi
fi

# --- report -------------------------------------------------------------------------------------
# The page goes to $results first, and over $out only when lockstep's build and benchmarks all ran.
echo "total_s=$(($(date +%s) - start))" >>"$results/machine.txt"
page=$results/benchmarks.md
python3 benchmarks/report/make_report.py --results "$results" --template benchmarks/report/benchmarks.md.in \
  --out "$page" || { log "make_report.py failed"; exit 1; }
if ((${#failed[@]})); then
  log "FAILED: ${failed[*]} (logs in $results); the page of this run is $page, $out is left as it was"
  exit 1
fi
mv "$page" "$out" || { log "cannot move $page to $out"; exit 1; }
# The tables as bar charts of their ratios, next to the page (img/), with Debian's matplotlib.
/usr/bin/python3 benchmarks/report/charts.py --page "$out" --out "$(dirname "$out")/img" >>"$results/charts.log" 2>&1 ||
  log "charts.py failed (see $results/charts.log): the page's pictures are those of an earlier run"
log "wrote $out (logs in $results)"
