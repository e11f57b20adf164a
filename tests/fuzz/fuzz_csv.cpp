// libFuzzer harness: lockstep::data::csv with the reader's options (header, label column, target
// columns, delimiter) drawn from the input's first bytes. Only lockstep::error may escape.
#include <cstddef>
#include <cstdint>

#include <lockstep/core/error.hpp>
#include <lockstep/data/csv.hpp>

#include "common.hpp"

namespace lf = lockstep::fuzz;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const lf::scratch_dir dir;
  const auto in = lf::csv_input::parse(data, size);
  const std::string path = dir.write("a", in.text);
  lockstep::data::csv_options o;
  o.header = (in.flags & 1) != 0;
  if (in.flags & 2) o.label_column = in.label % 8;
  if (in.flags & 4) o.target_columns.push_back((in.label >> 3) % 8);  // may be the label column: an error
  if (in.flags & 8)  // may repeat the first: an error; 15 stands for SIZE_MAX, a column no file has
    o.target_columns.push_back((in.flags >> 4) == 15 ? SIZE_MAX : std::size_t{in.flags} >> 4);
  o.delimiter = in.delimiter();
  try {
    const auto d = lockstep::data::csv(path, o);
    lockstep::fuzz::touch_every_sample(d);
  } catch (const lockstep::error&) {
  }
  return 0;
}
