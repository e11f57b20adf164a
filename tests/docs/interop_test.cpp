// The code blocks of docs/interop.md, compiled and run.
#include <doctest/doctest.h>

#include <filesystem>

#include "docs/common.hpp"

namespace ls = lockstep;

namespace {
using mlp = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dropout<1, 5>, ls::dense<512, 10>>;

// example-begin interop-names
using net = ls::sequential<ls::reshape<1, 8, 8>, ls::conv2d<4, 3, 1, 1>, ls::batch_norm<>, ls::relu,
                           ls::residual<ls::conv2d<4, 3, 1, 1>, ls::batch_norm<>, ls::relu>,
                           ls::max_pool2d<2>, ls::flatten, ls::dropout<1, 5>, ls::dense<64, 16>,
                           ls::relu, ls::dense<16, 5>>;
// example-end
}  // namespace

TEST_CASE("docs/interop.md: save and load safetensors") {
  const docs_test::scratch_directory dir("interop_save");
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<mlp>(ls::seed{3});
  const auto before = model.parameters_to_host();
  // example-begin interop-save
  ls::save_safetensors(model, "mlp.safetensors");                                  // fp32
  ls::save_safetensors(model, "mlp-bf16.safetensors", {.dtype = ls::io::safetensors_dtype::bf16});
  ls::load_safetensors(model, "mlp.safetensors");                                  // into every replica
  // example-end
  CHECK(std::filesystem::exists("mlp-bf16.safetensors"));
  CHECK(model.parameters_to_host() == before);  // fp32 round trip: the same bits
}

TEST_CASE("docs/interop.md: the example network exports") {
  const docs_test::scratch_directory dir("interop_names");
  ls::mirrored<ls::cpu<0>> strategy;
  auto model = strategy.replicate<net>(ls::seed{4});
  ls::save_safetensors(model, "net.safetensors");
  CHECK(std::filesystem::file_size("net.safetensors") > 0);
}
