// libFuzzer harness: lockstep::data::idx over an images file and a labels file, each plain or
// gzip (compressed by the harness, or gzip bytes as the input holds them). Anything but a
// lockstep::error escaping, a sanitizer report, a hang or a large allocation is a finding.
#include <cstddef>
#include <cstdint>

#include <lockstep/core/error.hpp>
#include <lockstep/data/idx.hpp>

#include "common.hpp"

namespace lf = lockstep::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lf::scratch_dir dir;
  const auto in = lf::idx_input::parse(data, size);
  const std::string images = dir.write("a", (in.flags & 1) ? lf::gzip(in.first) : in.first);
  const std::string labels = dir.write("b", (in.flags & 2) ? lf::gzip(in.second) : in.second);
  try {
    const auto d = (in.flags & 4) ? lockstep::data::idx(images) : lockstep::data::idx(images, labels);
    lockstep::fuzz::touch_every_sample(d);
  } catch (const lockstep::error&) {
  }
  return 0;
}
