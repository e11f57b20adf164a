#!/usr/bin/env bash
# Installs the Debian packages lockstep's build, tests and examples need, only those missing.
# Sourced by scripts/test.sh and scripts/demo.sh; runs as root (or through sudo) on Debian 12.
# libblas-dev, libgfortran-12-dev: the static reference BLAS (and the libgfortran.a it needs) that
# the GPU bundle's programs link (see tests/cuda/CMakeLists.txt).
# clang and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes): the fuzz harnesses, and
# scripts/test.sh builds and runs the host tests with clang++ as well as g++.
# libopenmpi-dev, openmpi-bin: Open MPI for the multi-worker strategies and their tests (label mpi).
# libdnnl-dev: oneDNN, the host GEMM that the default build (LOCKSTEP_HOST_GEMM=auto) picks when found;
# scripts/test.sh tests both that build and the OpenBLAS one.
# libpng-dev, libjpeg62-turbo-dev: libpng and libjpeg-turbo (its libjpeg API) for the optional image
# component (lockstep::images: PNG and JPEG decoding, image folders, tar shards) and its tests.
# ninja-build: scripts/test.sh's generator (its test-time builds, such as the compile-fail and
# header checks, then cost no make scan of the whole tree).
lockstep_packages=(cmake g++ clang make ninja-build libopenblas-dev doctest-dev libfmt-dev libcli11-dev zlib1g-dev
                   libblas-dev libgfortran-12-dev dataset-fashion-mnist libclang-rt-14-dev libopenmpi-dev
                   openmpi-bin libdnnl-dev libpng-dev libjpeg62-turbo-dev)

lockstep_install_deps() {
  local missing=() p
  for p in "${lockstep_packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  echo "lockstep: installing missing packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
