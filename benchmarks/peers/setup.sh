#!/usr/bin/env bash
# Installs the frameworks that benchmarks/run.sh measures beside lockstep ("peers"), each on its
# own so that one that cannot be installed is skipped with a note instead of failing the run:
#   - TensorFlow (PyPI `tensorflow-cpu`) and PyTorch into a virtual environment, build/peers-venv
#     by default (LOCKSTEP_PEERS_VENV). PyPI's `torch` wheel declares several GB of CUDA libraries
#     as dependencies; it is installed with --no-deps plus its pure-Python dependencies, and kept
#     only if `import torch` then trains on the CPU. Otherwise Debian's python3-torch is installed
#     with apt-get and run by the system's python3 (with Debian's numpy, which it is built against).
#   - dlib from Debian's libdlib-dev (its headers and library, for the compile-cost comparison).
# Writes one line per peer to $venv/peers.status:
#   peer=<name> status=ok version=<v> how=<pip|apt> [python=<interpreter to run it>]    or    peer=<name> status=skipped reason=<text>
# Runs as root (or through sudo) on Debian 12; re-running keeps what is already installed.
set -uo pipefail
cd "$(dirname "$0")/../.."
venv=${LOCKSTEP_PEERS_VENV:-build/peers-venv}
py=/usr/bin/python3
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2
}

apt_install python3-venv python3-pip time || echo "setup.sh: could not install python3-venv/time" >&2
# matplotlib draws the report's charts (benchmarks/report/charts.py, under /usr/bin/python3).
apt_install python3-matplotlib || echo "setup.sh: could not install python3-matplotlib: the report gets no new charts" >&2
if [ ! -x "$venv/bin/python" ]; then
  $py -m venv "$venv" || { echo "setup.sh: cannot create $venv" >&2; exit 1; }
fi
pip=("$venv/bin/python" -m pip install -q --no-cache-dir --disable-pip-version-check)
status=$venv/peers.status
: >"$status.new"
note() { echo "$*" | tee -a "$status.new"; }

# TensorFlow (CPU build); Keras comes with it.
if "$venv/bin/python" -c "import tensorflow" 2>/dev/null || "${pip[@]}" tensorflow-cpu >&2; then
  if v=$("$venv/bin/python" -c "import tensorflow as tf; print(tf.__version__)" 2>/dev/null); then
    note "peer=tensorflow status=ok version=$v how=pip python=$venv/bin/python"
  else
    note "peer=tensorflow status=skipped reason=import_failed_after_pip_install"
  fi
else
  note "peer=tensorflow status=skipped reason=pip_install_tensorflow-cpu_failed"
fi

# PyTorch: the PyPI wheel without its CUDA dependencies, checked by a CPU training step that
# also takes its input from numpy.
torch_check='import numpy, torch; m = torch.nn.Linear(4, 2); l = m(torch.from_numpy(numpy.ones((3, 4), numpy.float32))).sum(); l.backward(); import torch.distributed as d; assert d.is_available() and d.is_gloo_available(); print(torch.__version__)'
torch_how="" torch_py=""
if v=$("$venv/bin/python" -c "$torch_check" 2>/dev/null) && "$venv/bin/python" -m pip show -q torch 2>/dev/null; then
  torch_how=pip torch_py=$venv/bin/python
elif v=$($py -c "$torch_check" 2>/dev/null); then
  torch_how=apt torch_py=$py
else
  if "${pip[@]}" --no-deps torch >&2 && "${pip[@]}" filelock typing-extensions sympy networkx jinja2 fsspec >&2 &&
     v=$("$venv/bin/python" -c "$torch_check" 2>&1 | tail -n 1) && [[ $v =~ ^[0-9] ]]; then
    torch_how=pip torch_py=$venv/bin/python
  else
    echo "setup.sh: PyPI torch without its CUDA dependencies does not work ($v); installing Debian's python3-torch" >&2
    "$venv/bin/python" -m pip uninstall -q -y torch >&2 2>/dev/null
    # Debian's torch is built against Debian's numpy, which TensorFlow's numpy in the environment
    # would hide: it runs under the system's python3, outside the environment.
    if apt_install python3-torch python3-numpy && v=$($py -c "$torch_check" 2>/dev/null); then
      torch_how=apt torch_py=$py
    fi
  fi
fi
if [ -n "$torch_how" ]; then
  note "peer=pytorch status=ok version=$v how=$torch_how python=$torch_py"
else
  note "peer=pytorch status=skipped reason=neither_pypi_torch_nor_python3-torch_works"
fi

# dlib (C++ headers and library).
if apt_install libdlib-dev && [ -f /usr/include/dlib/dnn.h ]; then
  note "peer=dlib status=ok version=$(dpkg-query -W -f='${Version}' libdlib-dev) how=apt"
else
  note "peer=dlib status=skipped reason=apt-get_install_libdlib-dev_failed"
fi
mv "$status.new" "$status"
