// libFuzzer harness: lockstep::io::decode_safetensors over the input as it is, against a network
// with dense, conv2d, batch norm, residual and nested layers. Only lockstep::error may escape, and a
// file that decodes must re-encode and decode to the same values.
#include <cstddef>
#include <cstdint>

#include "safetensors_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  lockstep::fuzz::check_safetensors({data, size});
  return 0;
}
