#pragma once
/// @file safetensors_body.hpp
/// The body of the safetensors harness: decode the input against a small network that has every
/// layer kind with tensors (dense, conv2d, batch norm, a residual block, a nested sequential), and
/// require that a file that decodes re-encodes as F32 to a file that decodes to the same bits.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/io/safetensors.hpp>
#include <lockstep/layers/activations.hpp>
#include <lockstep/layers/conv.hpp>

namespace lockstep::fuzz {

/// The network the harness reads files for.
using safetensors_net =
    sequential<reshape<1, 4, 4>, conv2d<2, 3, 1, 1>, batch_norm<>, relu, residual<conv2d<2, 3, 1, 1>, relu>, flatten,
               dense<32, 3>, sequential<relu, dense<3, 2>>>;

/// Decodes `data` as a safetensors file of safetensors_net; only lockstep::error may escape.
inline void check_safetensors(std::span<const std::uint8_t> data) {
  constexpr std::size_t n = model<safetensors_net>::stored_count;
  std::vector<float> a(n), b(n);
  try {
    io::decode_safetensors<safetensors_net>(data, a, {.check_signature = (data.size() & 1) == 0}, "fuzz.safetensors");
  } catch (const error&) {
    return;
  }
  const auto again = io::encode_safetensors<safetensors_net>(a, 0);
  io::decode_safetensors<safetensors_net>(again, b);  // must not throw
  if (std::memcmp(a.data(), b.data(), n * sizeof(float)) != 0) std::abort();  // encode and decode disagree
}

}  // namespace lockstep::fuzz
