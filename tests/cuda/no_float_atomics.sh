#!/usr/bin/env bash
# No floating-point atomics in anything a GPU training step runs (the CUDA backend, the GPU
# reducers, the layers, losses and optimisers): every sum on the device is in a fixed order, so
# results are bitwise run to run. The only atomic allowed is the integer counter that elects the
# last block of the fused softmax loss (atomicAdd on an unsigned). Usage: no_float_atomics.sh SRC
set -euo pipefail
src=${1:?usage: no_float_atomics.sh SOURCE_DIR}
cd "$src/include/lockstep"
# Every atomic intrinsic call (atomicAdd, atomicSub, atomicExch, atomicMin, atomicMax, atomicCAS,
# their _block and _system forms), with file and line.
calls=$(grep -rnE '\batomic(Add|Sub|Exch|Min|Max|CAS|Inc|Dec|And|Or|Xor)(_block|_system)?[[:space:]]*\(' \
          backend distribute layers losses optimizers || true)
allowed='atomicAdd\(out\.finished, 1u\)'
bad=$(grep -vE "$allowed" <<<"$calls" | sed '/^$/d' || true)
if [[ -n "$bad" ]]; then
  echo "atomic operations outside the allowed integer counter (sums must be in a fixed order):"
  echo "$bad"
  exit 1
fi
n=$(sed '/^$/d' <<<"$calls" | wc -l)
[[ $n -ge 1 ]] || { echo "the softmax loss's last-block counter was not found: the pattern no longer matches the code"; exit 1; }
echo "no floating-point atomics: $n integer counter(s) only"
