// Checkpoints written by earlier checkpoint formats (tests/fixtures/checkpoints/, made by
// tests/fixtures/make_checkpoint_fixtures.cpp before format 3) still resume exactly: each is
// resumed mid-epoch and the run finished, and the parameters are bitwise those the library that
// wrote the file reached — where this machine runs the GEMM kernels that wrote them; elsewhere they
// agree to rounding.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "fixtures/checkpoint_run.hpp"

namespace {

namespace fs = std::filesystem;
namespace ls = lockstep;

std::vector<float> expected(const std::string& name) {
  std::ifstream in(fs::path(LOCKSTEP_FIXTURES_DIR) / (name + ".expected"), std::ios::binary);
  REQUIRE(in);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

template <class Optimizer>
void resume_fixture(const std::string& name, const Optimizer& opt, std::uint32_t version) {
  CAPTURE(name);
  const fs::path file = fs::path(LOCKSTEP_FIXTURES_DIR) / (name + ".lsck");
  CHECK(ls::load_checkpoint(file).version == version);
  const fs::path dir = fs::temp_directory_path() / ("lockstep-fixture-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(file, ls::checkpoint_manager(dir).path_for(3));
  ls::one_device<ls::cpu<0>> s;
  auto m = s.replicate<fixture_run::net>(ls::seed{fixture_run::seed});
  const ls::history h =
      ls::fit(s, m, opt, ls::softmax_cross_entropy{}, fixture_run::data(), fixture_run::second_part(dir.string()));
  CHECK(h.resumed_from_step == 3);
  CHECK(m.step() == 10);
  const std::vector<float> resumed = m.parameters_to_host(), want = expected(name);
  // The run trained here without a break.
  auto whole = s.replicate<fixture_run::net>(ls::seed{fixture_run::seed});
  (void)ls::fit(s, whole, opt, ls::softmax_cross_entropy{}, fixture_run::data(), {.epochs = 2, .quiet = true});
  const std::vector<float> uninterrupted = whole.parameters_to_host();
  REQUIRE(resumed.size() == want.size());
  REQUIRE(uninterrupted.size() == want.size());
  if (uninterrupted == want) {
    // The GEMM kernels that wrote the fixture: resuming it gives their bits exactly.
    CHECK(resumed == want);
  } else {
    // Other kernels (bitwise results hold per kernel set: an OpenBLAS kernel set chosen by
    // OPENBLAS_CORETYPE or by the CPU, or the oneDNN build): the file's first 3 updates came from
    // the fixture's kernels and the rest from these, so both runs agree with the fixture to
    // rounding — which a misread section (a parameter, a moment, the step) would not.
    MESSAGE("the GEMM kernels here (" << ls::host_gemm_name() << ") are not those that wrote " << name
                                      << ": compared to rounding, not bitwise");
    std::size_t far = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const float tol = 1e-4f * std::max(1.0f, std::abs(want[i]));
      if (!(std::abs(resumed[i] - want[i]) <= tol) || !(std::abs(uninterrupted[i] - want[i]) <= tol)) ++far;
    }
    CHECK(far == 0);
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("checkpoint fixtures: a format-1 file (SGD with momentum) resumes bitwise") {
  resume_fixture("v1_sgd_momentum", ls::sgd{.lr = 0.05f, .momentum = 0.9f}, 1);
}

TEST_CASE("checkpoint fixtures: a format-2 file (Adam) resumes bitwise") {
  resume_fixture("v2_adam", ls::adam{.lr = 1e-2f}, 2);
}
