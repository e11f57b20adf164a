// libFuzzer harness: a tar archive as the input holds it, through lockstep::data::scan_tar (the
// header index), webdataset_samples (the grouping into samples) and read_member (reads by
// offset) of every member. Only lockstep::error may escape; no allocation may follow a size the
// archive merely declares.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/tar.hpp>

#include "common.hpp"

namespace lf = lockstep::fuzz;
namespace ld = lockstep::data;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lf::scratch_dir dir;
  const std::string path = dir.write("a", {data, size});
  try {
    const ld::tar_index idx = ld::scan_tar(path, {.max_members = 4096, .max_member_bytes = std::uint64_t{1} << 24, .max_name = 1024});
    ld::detail::file_handle fd = ld::detail::open_read(path, "fuzz");
    std::vector<std::uint8_t> buf;
    unsigned sum = 0;
    for (const ld::tar_member& m : idx.members) {
      ld::read_member(fd.get(), path, m, buf);
      for (std::uint8_t v : buf) sum += v;
    }
    const auto samples = ld::webdataset_samples(idx, path);
    sum += static_cast<unsigned>(samples.size());
    static volatile unsigned sink;
    sink = sum;
  } catch (const lockstep::error&) {
  }
  return 0;
}
