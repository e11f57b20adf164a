#pragma once
/// @file checkpoint_body.hpp
/// The body shared by the two checkpoint harnesses: decode, check against a small model and two
/// optimisers, and require that a current-format file that decodes encodes back to the same bytes.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include <lockstep/core/error.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/train/checkpoint.hpp>
#include <lockstep/layers/dense.hpp>
#include <lockstep/layers/sequential.hpp>
#include <lockstep/optimizers/adam.hpp>
#include <lockstep/optimizers/sgd.hpp>

namespace lockstep::fuzz {

/// The model the harnesses check checkpoints against.
using checkpoint_net = sequential<dense<3, 2>, dense<2, 2>>;

/// Decodes `data` as a checkpoint; only lockstep::error may escape. A file that decodes as a
/// container of sections encodes back to exactly `data` when it is of the current format, and
/// its training state (model and fit sections) is decoded and checked against a small model and
/// two optimisers.
inline void check_checkpoint(std::span<const std::uint8_t> data) {
  try {
    const io::checkpoint_file f = io::decode_checkpoint_file(data, "fuzz.lsck");
    if (f.format() == io::checkpoint_version) {
      const auto again = io::encode_checkpoint_file(f);
      if (again.size() != data.size() || (!again.empty() && std::memcmp(again.data(), data.data(), again.size()) != 0))
        std::abort();  // decode and encode disagree
    }
    const checkpoint_state s = checkpoint_state::from_file(f);
    try {
      check_optimizer_state(s, sgd{.lr = 0.1f, .momentum = 0.9f}, model<checkpoint_net>::param_count, "fuzz.lsck");
    } catch (const checkpoint_error&) {
    }
    try {
      check_optimizer_state(s, adam{}, model<checkpoint_net>::param_count, "fuzz.lsck");
    } catch (const checkpoint_error&) {
    }
    check_signature(s, model_signature<checkpoint_net>(), "fuzz.lsck", "checkpoint_net");
  } catch (const error&) {
  }
}

/// Recomputes the header CRC and the CRC of every section whose frame fits in `b` (format 3
/// frames: tag, version, length; formats 1 and 2: tag, length), so that the payload parser, not
/// the checksum test, sees a mutation.
inline void fix_checkpoint_crcs(std::span<std::uint8_t> b) {
  if (b.size() < 20) return;
  std::uint32_t crc = io::crc32_of(b.first(16));
  std::memcpy(b.data() + 16, &crc, 4);
  std::uint32_t version = 0, count = 0;
  std::memcpy(&version, b.data() + 8, 4);
  std::memcpy(&count, b.data() + 12, 4);
  const std::size_t frame = version >= 3 ? 16 : 12;
  std::size_t pos = 20;
  for (std::uint32_t i = 0; i < count && i < 64 && b.size() - pos >= frame; ++i) {
    std::uint64_t len = 0;
    std::memcpy(&len, b.data() + pos + frame - 8, 8);
    if (len > b.size() - pos - frame || b.size() - pos - frame - len < 4) return;
    const std::size_t n = static_cast<std::size_t>(len);
    crc = io::crc32_of(b.subspan(pos, frame + n));
    std::memcpy(b.data() + pos + frame + n, &crc, 4);
    pos += frame + n + 4;
  }
}

}  // namespace lockstep::fuzz
