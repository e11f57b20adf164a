#pragma once
/// @file checkpoint_body.hpp
/// The body shared by the two checkpoint harnesses: decode, check against a small model and two
/// optimisers, and require that a version-2 file that decodes encodes back to the same bytes.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include <lockstep/core/error.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/layers/dense.hpp>
#include <lockstep/layers/sequential.hpp>
#include <lockstep/optimizers/adam.hpp>
#include <lockstep/optimizers/sgd.hpp>

namespace lockstep::fuzz {

/// The model the harnesses check checkpoints against.
using checkpoint_net = sequential<dense<3, 2>, dense<2, 2>>;

/// Decodes `data` as a checkpoint; only lockstep::error may escape, and a version-2 checkpoint
/// that decodes must encode back to exactly `data`.
inline void check_checkpoint(std::span<const std::uint8_t> data) {
  try {
    const checkpoint_state s = io::decode_checkpoint(data, "fuzz.lsck");
    if (s.version == io::checkpoint_version) {
      const auto again = io::encode_checkpoint(s);
      if (again.size() != data.size() || (!again.empty() && std::memcmp(again.data(), data.data(), again.size()) != 0))
        std::abort();  // decode and encode disagree
    }
    try {
      io::check_optimizer_state(s, sgd{.lr = 0.1f, .momentum = 0.9f}, model<checkpoint_net>::param_count, "fuzz.lsck");
    } catch (const checkpoint_error&) {
    }
    try {
      io::check_optimizer_state(s, adam{}, model<checkpoint_net>::param_count, "fuzz.lsck");
    } catch (const checkpoint_error&) {
    }
    io::check_signature(s, model_signature<checkpoint_net>(), "fuzz.lsck", "checkpoint_net");
  } catch (const error&) {
  }
}

/// Recomputes the header CRC and the CRC of every section whose frame fits in `b`, so that the
/// payload parser, not the checksum test, sees a mutation.
inline void fix_checkpoint_crcs(std::span<std::uint8_t> b) {
  if (b.size() < 20) return;
  std::uint32_t crc = io::crc32_of(b.first(16));
  std::memcpy(b.data() + 16, &crc, 4);
  std::size_t pos = 20;
  for (int i = 0; i < 7 && b.size() - pos >= 12; ++i) {
    std::uint64_t len = 0;
    std::memcpy(&len, b.data() + pos + 4, 8);
    if (len > b.size() - pos - 12 || b.size() - pos - 12 - len < 4) return;
    const std::size_t n = static_cast<std::size_t>(len);
    crc = io::crc32_of(b.subspan(pos, 12 + n));
    std::memcpy(b.data() + pos + 12 + n, &crc, 4);
    pos += 16 + n;
  }
}

}  // namespace lockstep::fuzz
