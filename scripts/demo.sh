#!/usr/bin/env bash
# Installs what lockstep needs, builds the examples, and runs the main job: data-parallel training
# of an MLP on Fashion-MNIST with 2 CPU replicas. Extra arguments go to the example
# (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
lockstep_install_deps >&2  # what it installs goes to stderr with the build's output

build=${LOCKSTEP_BUILD_DIR:-build-demo}
# Build output goes to stderr, so stdout carries only the program's results.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=OFF \
  -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_BUILD_BENCHMARKS=OFF >&2
cmake --build "$build" -j "$(nproc)" --target fashion_mnist >&2
exec "$build/examples/fashion_mnist" "$@"
