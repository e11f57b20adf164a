#!/usr/bin/env bash
# Prepares the Python environment of the interop tests (CTest label `interop`) and records the
# outcome in STATUS: "ok", or "skip: <reason>" when something cannot be had; it never fails, so
# that the tests report themselves skipped with the reason instead.
#
#   setup.sh VENV STATUS
#
# Debian's python3-torch and python3-matplotlib come from apt-get (installed here when missing and
# running as root, unless LOCKSTEP_INTEROP_INSTALL=0); VENV is a virtual environment over them
# (--system-site-packages) into which only tensorboard and safetensors are pip-installed.
set -uo pipefail
venv=$1
status=$2
mkdir -p "$(dirname "$status")"
log="$(dirname "$status")/setup.log"
: >"$log"
skip() {
  echo "skip: $*" >"$status"
  echo "lockstep interop: the interop tests will be skipped: $*"
  exit 0
}
py=/usr/bin/python3
[ -x "$py" ] || skip "no /usr/bin/python3 (Debian's python3)"
need=()
"$py" -c 'import torch' 2>/dev/null || need+=(python3-torch)
"$py" -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
"$py" -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if ((${#need[@]} > 0)); then
  if [ "${LOCKSTEP_INTEROP_INSTALL:-1}" != 1 ] || [ "$(id -u)" -ne 0 ]; then
    skip "missing Debian packages: ${need[*]} (apt-get install them, or run the tests as root)"
  fi
  echo "lockstep interop: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${need[@]}" >>"$log" 2>&1; then
    apt-get update -qq >>"$log" 2>&1
    apt-get install -y -qq --no-install-recommends "${need[@]}" >>"$log" 2>&1 ||
      skip "apt-get could not install ${need[*]} (see $log)"
  fi
fi
if ! "$venv/bin/python" -c 'import tensorboard, safetensors' 2>/dev/null; then
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv" >>"$log" 2>&1 || skip "python3 -m venv failed (see $log)"
  timeout 600 "$venv/bin/pip" install -q --disable-pip-version-check tensorboard safetensors >>"$log" 2>&1 ||
    skip "pip could not install tensorboard and safetensors (see $log)"
fi
"$venv/bin/python" -c 'import torch, matplotlib, tensorboard, safetensors.torch' >>"$log" 2>&1 ||
  skip "the environment does not import torch, matplotlib, tensorboard and safetensors.torch (see $log)"
echo ok >"$status"
echo "lockstep interop: $("$venv/bin/python" -c 'import torch, tensorboard, safetensors; print("torch", torch.__version__, "tensorboard", tensorboard.__version__, "safetensors", safetensors.__version__)')"
