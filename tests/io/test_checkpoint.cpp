#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
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
  s.callback_states = {{1.5, 2.0}, {}, {-0.25, 1e300, 3.0}};
  s.stop_requested = true;
  s.epoch_loss_sum = 12.375;
  s.epoch_samples = 88;
  s.epoch_steps = 11;
  s.epoch_labelled = 80;
  s.epoch_correct = 61;
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
  CHECK(t.callback_states == s.callback_states);
  CHECK(t.stop_requested == s.stop_requested);
  CHECK(t.epoch_loss_sum == s.epoch_loss_sum);
  CHECK(t.epoch_samples == s.epoch_samples);
  CHECK(t.epoch_steps == s.epoch_steps);
  CHECK(t.epoch_labelled == s.epoch_labelled);
  CHECK(t.epoch_correct == s.epoch_correct);
  CHECK(t.version == ls::io::checkpoint_version);
}

TEST_CASE("checkpoint: any number of callback states, of any sizes, round-trips") {
  for (std::size_t n : {0u, 1u, 2u, 5u, 13u}) {
    CAPTURE(n);
    auto s = sample_state();
    s.callback_states.clear();
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<double> v;
      for (std::size_t j = 0; j < (i * 7) % 5; ++j) v.push_back(double(i) - 0.5 * double(j));
      s.callback_states.push_back(v);
    }
    s.stop_requested = n % 2 == 1;
    const auto t = ls::io::decode_checkpoint(ls::io::encode_checkpoint(s), "mem");
    CHECK(t.callback_states == s.callback_states);
    CHECK(t.stop_requested == s.stop_requested);
  }
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

namespace {

// The version-1 file of `s`: the version-2 encoding without its callbacks section.
std::vector<std::uint8_t> as_version_1(const ls::checkpoint_state& s) {
  auto b = ls::io::encode_checkpoint(s);
  const auto sections = layout(b);
  b.resize(sections[sections.size() - 1].begin);  // drop the last (callbacks) section
  const std::uint32_t version = 1, count = 6;
  std::memcpy(b.data() + 8, &version, 4);
  std::memcpy(b.data() + 12, &count, 4);
  const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(b.data(), 16));
  std::memcpy(b.data() + 16, &crc, 4);
  return b;
}

}  // namespace

TEST_CASE("checkpoint: version 1 files are read, without callback state") {
  REQUIRE(layout(ls::io::encode_checkpoint(sample_state())).back().name == "callbacks");
  const auto s = sample_state();
  const auto v1 = as_version_1(s);
  const auto t = ls::io::decode_checkpoint(v1, "old.lsck");
  CHECK(t.version == 1);
  CHECK(t.parameters == s.parameters);
  CHECK(t.optimizer_state == s.optimizer_state);
  CHECK(t.step == s.step);
  CHECK(t.lr_factor == s.lr_factor);
  CHECK(t.callback_states.empty());
  CHECK(!t.stop_requested);
  CHECK(t.epoch_samples == 0);
  // a version-1 header followed by a callbacks section: trailing bytes
  auto extra = ls::io::encode_checkpoint(s);
  const std::uint32_t version = 1;
  std::memcpy(extra.data() + 8, &version, 4);
  const std::uint32_t seven = 7;
  std::memcpy(extra.data() + 12, &seven, 4);
  std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(extra.data(), 16));
  std::memcpy(extra.data() + 16, &crc, 4);
  CHECK(message_of(extra).find("expected 6 sections in version 1") != std::string::npos);
  const std::uint32_t six = 6;
  std::memcpy(extra.data() + 12, &six, 4);
  crc = ls::io::crc32_of(std::span<const std::uint8_t>(extra.data(), 16));
  std::memcpy(extra.data() + 16, &crc, 4);
  CHECK(message_of(extra).find("trailing") != std::string::npos);
  // a version-2 header over a version-1 body lacks the callbacks section
  auto short2 = v1;
  const std::uint32_t two = 2;
  std::memcpy(short2.data() + 8, &two, 4);
  std::memcpy(short2.data() + 12, &seven, 4);
  crc = ls::io::crc32_of(std::span<const std::uint8_t>(short2.data(), 16));
  std::memcpy(short2.data() + 16, &crc, 4);
  CHECK(message_of(short2).find("section 'callbacks'") != std::string::npos);
  // every truncation of a version-1 file is detected too
  for (std::size_t len = 0; len < v1.size(); len += 5) {
    CAPTURE(len);
    CHECK(!message_of(std::vector<std::uint8_t>(v1.begin(), v1.begin() + static_cast<std::ptrdiff_t>(len))).empty());
  }
}

TEST_CASE("checkpoint: a callbacks section declaring more states than it holds is refused") {
  auto s = sample_state();
  s.callback_states = {{1.0}};
  auto b = ls::io::encode_checkpoint(s);
  const auto sec = layout(b).back();
  REQUIRE(sec.name == "callbacks");
  // the count sits after the tag (4), length (8), stop flag (1) and five sums (40)
  const std::size_t count_at = sec.begin + 12 + 1 + 40;
  for (std::uint64_t bad : {std::uint64_t{2}, std::uint64_t{1000}, ~std::uint64_t{0}}) {
    CAPTURE(bad);
    auto c = b;
    std::memcpy(c.data() + count_at, &bad, 8);
    const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(c.data() + sec.begin, sec.end - 4 - sec.begin));
    std::memcpy(c.data() + sec.end - 4, &crc, 4);
    const std::string msg = message_of(c);
    CHECK(msg.find("section 'callbacks'") != std::string::npos);
  }
  // a stop flag other than 0 or 1
  auto c = b;
  c[sec.begin + 12] = 7;
  const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(c.data() + sec.begin, sec.end - 4 - sec.begin));
  std::memcpy(c.data() + sec.end - 4, &crc, 4);
  CHECK(message_of(c).find("stop flag 7") != std::string::npos);
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
