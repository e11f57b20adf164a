// libFuzzer harness: lockstep::io::decode_checkpoint over the input as it is (most mutations
// are caught by a checksum). Only lockstep::error may escape.
#include <cstddef>
#include <cstdint>

#include "checkpoint_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  lockstep::fuzz::check_checkpoint({data, size});
  return 0;
}
