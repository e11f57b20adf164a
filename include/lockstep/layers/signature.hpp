#pragma once
/// @file signature.hpp
/// What identifies a network in checkpoints and exported weights: `model_signature<Net>()`, a
/// structural fingerprint, and `model_name<Net>()`, its type name for messages.

#include <cxxabi.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <typeinfo>

#include <lockstep/layers/layer.hpp>
#include <lockstep/layers/model.hpp>

namespace lockstep {

/// A structural fingerprint of network Net: a 64-bit FNV-1a hash of its input width, output
/// width, total parameter count, number of top-level layers, and each top-level layer's parameter
/// count and output width. It changes when the width or parameter count of a top-level layer
/// changes; it does not see parameter-free differences that keep those (relu vs tanh, a dropout
/// rate, or a width inside a nested sequential or residual block whose own output width and
/// parameter counts stay: a pooling's stride there).
template <class Net>
[[nodiscard]] constexpr std::uint64_t model_signature() noexcept {
  using bound = typename model<Net>::bound;
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  };
  mix(bound::input_size);
  mix(bound::output_size);
  mix(bound::param_count);
  if constexpr (state_count_v<bound> > 0) mix(state_count_v<bound>);  // models without state keep their signature
  if constexpr (requires { bound::layer_count; }) {
    mix(bound::layer_count);
    for (std::size_t i = 0; i < bound::layer_count; ++i) {
      mix(bound::params[i]);
      mix(bound::outputs[i]);
    }
  } else {
    mix(1);
  }
  return h;
}

/// The readable name of type T (the compiler's name, demangled; for messages and checkpoints).
template <class T>
[[nodiscard]] std::string model_name() {
  const char* mangled = typeid(T).name();
  int status = 0;
  char* readable = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && readable ? readable : mangled;
  std::free(readable);
  return name;
}

}  // namespace lockstep
