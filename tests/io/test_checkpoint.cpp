#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <lockstep/io.hpp>
#include <lockstep/layers.hpp>

namespace ls = lockstep;
namespace fs = std::filesystem;

namespace {

using small_net = ls::sequential<ls::dense<6, 5>, ls::relu, ls::dense<5, 3>>;
using other_net = ls::sequential<ls::dense<6, 4>, ls::relu, ls::dense<4, 3>>;

ls::checkpoint_state sample_state() {
  ls::checkpoint_state s;
  s.signature = ls::model_signature<small_net>();
  s.model_name = ls::io::model_name<small_net>();
  for (std::size_t i = 0; i < ls::model<small_net>::param_count; ++i) s.parameters.push_back(0.25f * float(i) - 3.0f);
  for (std::size_t i = 0; i < 2 * s.parameters.size(); ++i) s.optimizer_state.push_back(1e-3f * float(i));
  s.step = 1234;
  s.epoch = 7;
  s.batches = 11;
  s.base_lr = 1e-3f;
  s.lr_factor = 0.5f;
  s.lr = 4e-4f;
  s.seed = 42;
  s.data_seed = 7;
  s.replicas = 3;
  return s;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("lockstep_io_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string message_of(const std::vector<std::uint8_t>& bytes) {
  try {
    (void)ls::io::decode_checkpoint(bytes, "mem.lsck");
  } catch (const ls::checkpoint_error& e) {
    return e.what();
  }
  return {};
}

// Section boundaries of an encoded checkpoint: (name, first byte, one past the last byte).
struct span_of {
  std::string name;
  std::size_t begin, end;
};
std::vector<span_of> layout(const std::vector<std::uint8_t>& b) {
  std::vector<span_of> out{{"header", 0, 20}};
  std::size_t pos = 20;
  for (const auto& info : ls::io::detail::sections) {
    std::uint64_t len = 0;
    std::memcpy(&len, b.data() + pos + 4, 8);
    const std::size_t end = pos + 12 + static_cast<std::size_t>(len) + 4;
    out.push_back({info.name, pos, end});
    pos = end;
  }
  return out;
}

}  // namespace

TEST_CASE("checkpoint: encode/decode round-trips every field") {
  const auto s = sample_state();
  const auto t = ls::io::decode_checkpoint(ls::io::encode_checkpoint(s), "mem");
  CHECK(t.signature == s.signature);
  CHECK(t.model_name == s.model_name);
  CHECK(t.parameters == s.parameters);
  CHECK(t.optimizer_state == s.optimizer_state);
  CHECK(t.step == s.step);
  CHECK(t.epoch == s.epoch);
  CHECK(t.batches == s.batches);
  CHECK(t.base_lr == s.base_lr);
  CHECK(t.lr_factor == s.lr_factor);
  CHECK(t.lr == s.lr);
  CHECK(t.seed == s.seed);
  CHECK(t.data_seed == s.data_seed);
  CHECK(t.replicas == s.replicas);
}

TEST_CASE("checkpoint: empty parameters and optimizer state round-trip") {
  ls::checkpoint_state s;
  const auto t = ls::io::decode_checkpoint(ls::io::encode_checkpoint(s), "mem");
  CHECK(t.parameters.empty());
  CHECK(t.optimizer_state.empty());
}

TEST_CASE("checkpoint: a file round-trips through save and load") {
  const auto dir = temp_dir("file");
  const auto s = sample_state();
  ls::save_checkpoint(dir / "a.lsck", s);
  const auto t = ls::load_checkpoint(dir / "a.lsck", ls::model_signature<small_net>());
  CHECK(t.parameters == s.parameters);
  CHECK(t.step == s.step);
  // nothing but the file itself is left in the directory (no temporaries)
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: a corrupt byte in any section names that section") {
  const auto good = ls::io::encode_checkpoint(sample_state());
  for (const auto& sec : layout(good)) {
    CAPTURE(sec.name);
    // flip a byte at the start, the middle and the end of the section
    for (std::size_t at : {sec.begin, (sec.begin + sec.end) / 2, sec.end - 1}) {
      CAPTURE(at);
      auto bad = good;
      bad[at] ^= 0x5a;
      const std::string msg = message_of(bad);
      REQUIRE(!msg.empty());
      CHECK(msg.find("mem.lsck") != std::string::npos);
      CHECK(msg.find("section '" + sec.name + "'") != std::string::npos);
      CHECK(msg.find("offset") != std::string::npos);
    }
  }
}

TEST_CASE("checkpoint: every truncation is detected") {
  const auto good = ls::io::encode_checkpoint(sample_state());
  for (std::size_t len = 0; len < good.size(); len += (len < 64 ? 1 : 7)) {
    CAPTURE(len);
    const std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    const std::string msg = message_of(cut);
    CHECK(!msg.empty());
  }
  auto longer = good;
  longer.push_back(0);
  CHECK(message_of(longer).find("trailing") != std::string::npos);
}

TEST_CASE("checkpoint: a truncated file on disk raises checkpoint_error naming the file") {
  const auto dir = temp_dir("trunc");
  const auto good = ls::io::encode_checkpoint(sample_state());
  for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{19}, std::size_t{40}, good.size() / 2, good.size() - 1}) {
    CAPTURE(len);
    {
      std::ofstream f(dir / "t.lsck", std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(good.data()), static_cast<std::streamsize>(len));
    }
    try {
      (void)ls::load_checkpoint(dir / "t.lsck");
      FAIL("no exception");
    } catch (const ls::checkpoint_error& e) {
      CHECK(std::string(e.what()).find("t.lsck") != std::string::npos);
    }
  }
  CHECK_THROWS_AS((void)ls::load_checkpoint(dir / "missing.lsck"), ls::checkpoint_error);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: bad magic and unsupported version are reported") {
  auto bytes = ls::io::encode_checkpoint(sample_state());
  auto bad = bytes;
  bad[0] = 'X';
  CHECK(message_of(bad).find("magic") != std::string::npos);
  bad = bytes;
  bad[8] = 99;  // version, with a recomputed header CRC so the version check itself fires
  const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(bad.data(), 16));
  std::memcpy(bad.data() + 16, &crc, 4);
  CHECK(message_of(bad).find("version 99") != std::string::npos);
}

TEST_CASE("checkpoint: a checkpoint of another model is refused") {
  static_assert(ls::model_signature<small_net>() != ls::model_signature<other_net>());
  static_assert(ls::model_signature<small_net>() == ls::model_signature<small_net>());
  const auto dir = temp_dir("sig");
  ls::save_checkpoint(dir / "m.lsck", sample_state());
  try {
    (void)ls::load_checkpoint(dir / "m.lsck", ls::model_signature<other_net>());
    FAIL("no exception");
  } catch (const ls::checkpoint_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("m.lsck") != std::string::npos);
    CHECK(msg.find("section 'model'") != std::string::npos);
    CHECK(msg.find("signature") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoint_manager: keeps the newest K and finds the latest") {
  const auto dir = temp_dir("mgr");
  for (std::size_t keep : {1u, 2u, 3u}) {
    CAPTURE(keep);
    fs::remove_all(dir);
    ls::checkpoint_manager mgr(dir, keep);
    CHECK(!mgr.latest());
    auto s = sample_state();
    for (std::uint64_t step = 1; step <= 6; ++step) {
      s.step = step;
      mgr.save(s);
      CHECK(mgr.list().size() == std::min<std::size_t>(step, keep));
      CHECK(mgr.latest() == mgr.path_for(step));
    }
    // a stray temporary from an interrupted save is ignored and cleaned up by the next save
    { std::ofstream(dir / ".ckpt-000000000007.lsck.tmp.abcdef") << "torn"; }
    CHECK(mgr.load_latest(ls::model_signature<small_net>())->step == 6);
    s.step = 7;
    mgr.save(s);
    CHECK(!fs::exists(dir / ".ckpt-000000000007.lsck.tmp.abcdef"));
    CHECK(mgr.load_latest(ls::model_signature<small_net>())->step == 7);
  }
  CHECK_THROWS_AS(ls::checkpoint_manager(dir, 0), ls::config_error);
  fs::remove_all(dir);
}
