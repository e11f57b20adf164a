// Checkpoints written by earlier checkpoint formats (tests/fixtures/checkpoints/, made by
// tests/fixtures/make_checkpoint_fixtures.cpp before format 3) still resume exactly: each is
// resumed mid-epoch and the run finished, and the parameters are bitwise those the library that
// wrote the file reached.

#include <doctest/doctest.h>

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
  CHECK(m.parameters_to_host() == expected(name));
  // Resuming is exact: the same bits as the run trained without a break.
  auto whole = s.replicate<fixture_run::net>(ls::seed{fixture_run::seed});
  (void)ls::fit(s, whole, opt, ls::softmax_cross_entropy{}, fixture_run::data(), {.epochs = 2, .quiet = true});
  CHECK(whole.parameters_to_host() == expected(name));
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("checkpoint fixtures: a format-1 file (SGD with momentum) resumes bitwise") {
  resume_fixture("v1_sgd_momentum", ls::sgd{.lr = 0.05f, .momentum = 0.9f}, 1);
}

TEST_CASE("checkpoint fixtures: a format-2 file (Adam) resumes bitwise") {
  resume_fixture("v2_adam", ls::adam{.lr = 1e-2f}, 2);
}
