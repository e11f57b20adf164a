// libFuzzer harness: lockstep::data::npy over a features file and, when the flags say so, a labels
// file (split as common.hpp's npy_input says), as rows or as HWC/CHW images, through one epoch of
// an index-first pipeline cut for one of two workers, so every row a worker keeps is read from
// the file. Only lockstep::error may escape.
#include <cstddef>
#include <cstdint>

#include <lockstep/core/error.hpp>
#include <lockstep/data.hpp>

#include "common.hpp"

namespace lf = lockstep::fuzz;
namespace ld = lockstep::data;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lf::scratch_dir dir;
  const auto in = lf::npy_input::parse(data, size);
  const std::string features = dir.write("a", in.first);
  const std::string labels = dir.write("b", in.second);
  ld::npy_options o;
  const int layout = (in.flags >> 1) & 3;
  o.layout = layout == 1 ? ld::npy_layout::hwc : layout == 2 ? ld::npy_layout::chw : ld::npy_layout::rows;
  o.load.threads = 1;
  try {
    const auto src = (in.flags & 1) ? ld::npy(features, labels, o) : ld::npy(features, o);
    double sum = 0;
    for (auto&& b : (src | ld::batched(7)).epoch(0)) {
      const auto db = ld::detail::make_sharded(std::move(b), 2, (in.flags >> 3) & 1, 1);
      const ld::shard& s = db.shards[0];
      for (std::size_t i = 0; i < s.size * s.width; ++i) sum += s.features[i];
      for (std::size_t i = 0; s.labels && i < s.size; ++i) sum += s.labels[i];
    }
    static volatile double sink;
    sink = sum;
  } catch (const lockstep::error&) {
  }
  return 0;
}
