// libFuzzer harness: lockstep::io::decode_checkpoint over the input with its checksums
// recomputed, so that mutations reach the payload parser. Only lockstep::error may escape.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "checkpoint_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::uint8_t> b(data, data + size);
  lockstep::fuzz::fix_checkpoint_crcs(b);
  lockstep::fuzz::check_checkpoint(b);
  return 0;
}
