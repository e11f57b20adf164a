#pragma once
// Checkpoints of formats 1 and 2, as the library wrote them before format 3, from a
// checkpoint_state: the checkpoint tests check that they are still read, and the fuzz harnesses
// start from them too.

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <lockstep/io/checkpoint.hpp>
#include <lockstep/io/serialization.hpp>
#include <lockstep/train/checkpoint.hpp>

namespace lockstep::testing_support {

// The bytes of `s` in checkpoint format 2 (or 1: without the callbacks section), as the library
// wrote them before format 3 (docs/checkpoints.md, "Formats 1 and 2").
inline std::vector<std::uint8_t> legacy_checkpoint_bytes(const lockstep::checkpoint_state& s, std::uint32_t version) {
  namespace ls = lockstep;
  std::vector<std::uint8_t> out(20);
  out.reserve(4096);
  std::memcpy(out.data(), ls::io::checkpoint_magic.data(), 8);
  const std::uint32_t count = version == 1 ? 6 : 7;
  std::memcpy(out.data() + 8, &version, 4);
  std::memcpy(out.data() + 12, &count, 4);
  const std::uint32_t head_crc = ls::io::crc32_of(std::span<const std::uint8_t>(out.data(), 16));
  std::memcpy(out.data() + 16, &head_crc, 4);
  auto section = [&out](std::uint32_t tag, const ls::io::writer& payload) {
    ls::io::writer f;
    f.put(tag);
    f.put(static_cast<std::uint64_t>(payload.bytes().size()));
    f.put_bytes(payload.bytes());
    const std::uint32_t crc = ls::io::crc32_of(f.bytes());
    f.put(crc);
    out.insert(out.end(), f.bytes().begin(), f.bytes().end());
  };
  ls::io::writer m;
  m.put(s.signature);
  m.put(static_cast<std::uint64_t>(s.parameters.size()));
  m.put_string(s.model_name);
  section(ls::io::tags::model, m);
  ls::io::writer p;
  p.put_array<float>(s.parameters);
  section(ls::io::tags::parameters, p);
  ls::io::writer o;
  o.put_array<float>(s.optimizer_state);
  section(ls::io::tags::optimizer, o);
  ls::io::writer g;
  g.put(s.step);
  g.put(s.epoch);
  g.put(s.batches);
  section(ls::io::tags::progress, g);
  ls::io::writer sc;
  sc.put(s.base_lr);
  sc.put(s.lr_factor);
  sc.put(s.lr);
  section(ls::io::tags::schedule, sc);
  ls::io::writer r;
  r.put(s.seed);
  r.put(s.data_seed);
  r.put(s.replicas);
  section(ls::io::tags::rng, r);
  if (version >= 2) {
    ls::io::writer c;
    c.put(static_cast<std::uint8_t>(s.stop_requested ? 1 : 0));
    c.put(s.epoch_loss_sum);
    c.put(s.epoch_samples);
    c.put(s.epoch_steps);
    c.put(s.epoch_labelled);
    c.put(s.epoch_correct);
    c.put(static_cast<std::uint64_t>(s.callback_states.size()));
    for (const auto& v : s.callback_states) c.put_array<double>(v);
    section(ls::io::tags::callbacks, c);
  }
  return out;
}

}  // namespace lockstep::testing_support
