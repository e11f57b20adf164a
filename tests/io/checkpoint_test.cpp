#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <lockstep/io.hpp>
#include <lockstep/layers.hpp>
#include <lockstep/optimizers.hpp>
#include <lockstep/train/checkpoint.hpp>

#include "support/legacy_checkpoint.hpp"

namespace ls = lockstep;
namespace fs = std::filesystem;

namespace {

using small_net = ls::sequential<ls::dense<6, 5>, ls::relu, ls::dense<5, 3>>;
using other_net = ls::sequential<ls::dense<6, 4>, ls::relu, ls::dense<4, 3>>;

ls::checkpoint_state sample_state() {
  ls::checkpoint_state s;
  s.signature = ls::model_signature<small_net>();
  s.model_name = ls::model_name<small_net>();
  s.optimizer_name = "lockstep::adam";
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
    (void)ls::decode_checkpoint(bytes, "mem.lsck");
  } catch (const ls::checkpoint_error& e) {
    return e.what();
  }
  return {};
}

// Section boundaries of an encoded format-3 checkpoint: (name, first byte, one past the last byte).
struct span_of {
  std::string name;
  std::size_t begin, end;
};
std::string name_of(std::uint32_t tag) {
  if (tag == ls::io::tags::model) return "model";
  if (tag == ls::io::tags::parameters) return "parameters";
  if (tag == ls::io::tags::optimizer) return "optimizer";
  if (tag == ls::io::tags::fit) return "fit";
  return ls::io::tag_text(tag);
}
std::vector<span_of> layout(const std::vector<std::uint8_t>& b) {
  std::vector<span_of> out{{"header", 0, 20}};
  std::uint32_t count = 0;
  std::memcpy(&count, b.data() + 12, 4);
  std::size_t pos = 20;
  for (std::uint32_t k = 0; k < count; ++k) {
    std::uint32_t tag = 0;
    std::uint64_t len = 0;
    std::memcpy(&tag, b.data() + pos, 4);
    std::memcpy(&len, b.data() + pos + 8, 8);
    const std::size_t end = pos + 16 + static_cast<std::size_t>(len) + 4;
    out.push_back({name_of(tag), pos, end});
    pos = end;
  }
  return out;
}
// The first payload byte of a format-3 section.
std::size_t payload_of(const span_of& s) { return s.begin + 16; }


}  // namespace

TEST_CASE("checkpoint: encode/decode round-trips every field") {
  const auto s = sample_state();
  const auto t = ls::decode_checkpoint(ls::encode_checkpoint(s), "mem");
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
  CHECK(t.optimizer_name == s.optimizer_name);
  CHECK(t.has_callback_state);
  CHECK(t.version == ls::io::checkpoint_version);
  CHECK(t.version == 3);
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
    const auto t = ls::decode_checkpoint(ls::encode_checkpoint(s), "mem");
    CHECK(t.callback_states == s.callback_states);
    CHECK(t.stop_requested == s.stop_requested);
  }
}

TEST_CASE("checkpoint: empty parameters and optimizer state round-trip") {
  ls::checkpoint_state s;
  const auto t = ls::decode_checkpoint(ls::encode_checkpoint(s), "mem");
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
  const auto good = ls::encode_checkpoint(sample_state());
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
      CHECK(msg.find("offset") != std::string::npos);
      if (sec.name == "header" || at >= sec.begin + 4)  // a flipped tag byte leaves no name to give, only the damage
        CHECK(msg.find("section '" + sec.name + "'") != std::string::npos);
      else
        CHECK(msg.find("checksum mismatch") != std::string::npos);
    }
  }
}

TEST_CASE("checkpoint: every truncation is detected") {
  const auto good = ls::encode_checkpoint(sample_state());
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
  const auto good = ls::encode_checkpoint(sample_state());
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
  auto bytes = ls::encode_checkpoint(sample_state());
  auto bad = bytes;
  bad[0] = 'X';
  CHECK(message_of(bad).find("magic") != std::string::npos);
  bad = bytes;
  bad[8] = 99;  // version, with a recomputed header CRC so the version check itself fires
  const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(bad.data(), 16));
  std::memcpy(bad.data() + 16, &crc, 4);
  CHECK(message_of(bad).find("version 99") != std::string::npos);
}

TEST_CASE("checkpoint: files of formats 1 and 2 are read, and format 1 has no callback state") {
  const auto s = sample_state();
  for (std::uint32_t version : {1u, 2u}) {
    CAPTURE(version);
    const auto old = ls::testing_support::legacy_checkpoint_bytes(s, version);
    const auto t = ls::decode_checkpoint(old, "old.lsck");
    CHECK(t.version == version);
    CHECK(t.signature == s.signature);
    CHECK(t.parameters == s.parameters);
    CHECK(t.optimizer_state == s.optimizer_state);
    CHECK(t.optimizer_name.empty());  // formats 1 and 2 do not name the optimiser
    CHECK(t.step == s.step);
    CHECK(t.epoch == s.epoch);
    CHECK(t.batches == s.batches);
    CHECK(t.lr_factor == s.lr_factor);
    CHECK(t.seed == s.seed);
    CHECK(t.replicas == s.replicas);
    CHECK(t.has_callback_state == (version == 2));
    CHECK(t.callback_states == (version == 2 ? s.callback_states : std::vector<std::vector<double>>{}));
    CHECK(t.stop_requested == (version == 2 && s.stop_requested));
    CHECK(t.epoch_samples == (version == 2 ? s.epoch_samples : 0));
    // every truncation of an old file is detected too
    for (std::size_t len = 0; len < old.size(); len += 5) {
      CAPTURE(len);
      CHECK(!message_of(std::vector<std::uint8_t>(old.begin(), old.begin() + static_cast<std::ptrdiff_t>(len))).empty());
    }
  }
  // a version-1 header followed by a callbacks section: trailing bytes
  auto extra = ls::testing_support::legacy_checkpoint_bytes(s, 2);
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
  auto short2 = ls::testing_support::legacy_checkpoint_bytes(s, 1);
  const std::uint32_t two = 2;
  std::memcpy(short2.data() + 8, &two, 4);
  std::memcpy(short2.data() + 12, &seven, 4);
  crc = ls::io::crc32_of(std::span<const std::uint8_t>(short2.data(), 16));
  std::memcpy(short2.data() + 16, &crc, 4);
  CHECK(message_of(short2).find("section 'callbacks'") != std::string::npos);
}

TEST_CASE("checkpoint: format 3 ignores sections it does not know and refuses repeated or missing ones") {
  const auto s = sample_state();
  ls::io::checkpoint_file f = s.to_file();
  f.put(ls::io::section_tag("XTRA"), 7, std::vector<std::uint8_t>{1, 2, 3});
  const auto t = ls::checkpoint_state::from_file(ls::io::decode_checkpoint_file(ls::io::encode_checkpoint_file(f), "x"));
  CHECK(t.parameters == s.parameters);
  CHECK(t.callback_states == s.callback_states);
  CHECK_THROWS_AS(f.put(ls::io::tags::model, 2, std::vector<std::uint8_t>{}), ls::config_error);
  // a file whose model section was dropped names the missing section
  ls::io::checkpoint_file g;
  ls::write_fit_state(g, s);
  try {
    (void)ls::checkpoint_state::from_file(ls::io::decode_checkpoint_file(ls::io::encode_checkpoint_file(g), "g.lsck"));
    FAIL("no exception");
  } catch (const ls::checkpoint_error& e) {
    CHECK(std::string(e.what()).find("g.lsck: section 'model' (MODL) is missing") != std::string::npos);
  }
  // a section of a version this library does not read
  ls::io::checkpoint_file h;
  ls::io::writer w;
  h.put(ls::io::tags::fit, 9, std::vector<std::uint8_t>{});
  ls::write_model_state(h, s);
  const std::string msg = message_of(ls::io::encode_checkpoint_file(h));
  CHECK(msg.find("section 'fit'") != std::string::npos);
  CHECK(msg.find("unsupported section version 9") != std::string::npos);
  // the same tag twice in a file
  auto bytes = ls::io::encode_checkpoint_file(s.to_file());
  const auto l = layout(bytes);
  std::vector<std::uint8_t> twice(bytes.begin(), bytes.end());
  twice.insert(twice.end(), bytes.begin() + static_cast<std::ptrdiff_t>(l[1].begin),
               bytes.begin() + static_cast<std::ptrdiff_t>(l[1].end));
  const std::uint32_t count = static_cast<std::uint32_t>(l.size());  // one more than before
  std::memcpy(twice.data() + 12, &count, 4);
  const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(twice.data(), 16));
  std::memcpy(twice.data() + 16, &crc, 4);
  CHECK(message_of(twice).find("appears twice") != std::string::npos);
}

TEST_CASE("checkpoint: a fit section declaring more callback states than it holds is refused") {
  auto s = sample_state();
  s.callback_states = {{1.0}};
  auto b = ls::encode_checkpoint(s);
  const auto sec = layout(b).back();
  REQUIRE(sec.name == "fit");
  // the count sits after the position, rates, seeds and replicas (48 bytes), the stop flag (1)
  // and five sums (40)
  const std::size_t count_at = payload_of(sec) + 48 + 1 + 40;
  for (std::uint64_t bad : {std::uint64_t{2}, std::uint64_t{1000}, ~std::uint64_t{0}}) {
    CAPTURE(bad);
    auto c = b;
    std::memcpy(c.data() + count_at, &bad, 8);
    const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(c.data() + sec.begin, sec.end - 4 - sec.begin));
    std::memcpy(c.data() + sec.end - 4, &crc, 4);
    const std::string msg = message_of(c);
    CHECK(msg.find("section 'fit'") != std::string::npos);
  }
  // a stop flag other than 0 or 1
  auto c = b;
  c[payload_of(sec) + 48] = 7;
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
    // the offset named is where the file holds the signature
    const auto at = msg.find("at offset ");
    REQUIRE(at != std::string::npos);
    const std::size_t offset = std::stoull(msg.substr(at + 10));
    std::ifstream in(dir / "m.lsck", std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(offset + 8 <= bytes.size());
    std::uint64_t stored = 0;
    for (int b = 7; b >= 0; --b) stored = stored << 8 | static_cast<unsigned char>(bytes[offset + static_cast<std::size_t>(b)]);
    CHECK(stored == ls::model_signature<small_net>());
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
      CHECK(ls::checkpoint_manager::step_of(*mgr.latest()) == step);
    }
    // a stray temporary from an interrupted save is ignored and cleaned up by the next save
    { std::ofstream(dir / ".ckpt-000000000007.lsck.tmp.abcdef") << "torn"; }
    CHECK(ls::checkpoint_state::from_file(*mgr.load_latest(ls::model_signature<small_net>())).step == 6);
    s.step = 7;
    mgr.save(s);
    CHECK(!fs::exists(dir / ".ckpt-000000000007.lsck.tmp.abcdef"));
    CHECK(ls::checkpoint_state::from_file(*mgr.load_latest(ls::model_signature<small_net>())).step == 7);
  }
  CHECK_THROWS_AS(ls::checkpoint_manager(dir, 0), ls::config_error);
  // A directory that cannot be read is an error naming it, not an empty list (a resume would start
  // over, and no checkpoint would be deleted); one that does not exist (yet) holds none.
  fs::remove_all(dir);
  ls::checkpoint_manager gone(dir / "run", 2);
  fs::remove_all(dir / "run");
  CHECK(gone.list().empty());
  CHECK(!gone.latest());
  { std::ofstream(dir / "run") << "not a directory"; }
  std::string msg;
  try {
    (void)gone.latest();
  } catch (const ls::checkpoint_error& e) {
    msg = e.what();
  }
  CAPTURE(msg);
  CHECK(msg.find((dir / "run").string() + ": cannot list the directory") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: a file is readable as the umask allows (0666 less it), and a directory is a checkpoint_error naming it") {
  const auto dir = temp_dir("mode");
  const auto s = sample_state();
  struct umask_scope {  // sets the process's umask, and puts the old one back however the scope ends
    ::mode_t before;
    explicit umask_scope(::mode_t mask) : before(::umask(mask)) {}
    ~umask_scope() { (void)::umask(before); }
  };
  for (const ::mode_t mask : {::mode_t{022}, ::mode_t{027}, ::mode_t{077}}) {
    CAPTURE(mask);
    {
      const umask_scope scope(mask);
      ls::save_checkpoint(dir / "a.lsck", s);
    }
    const auto mode = static_cast<unsigned>(fs::status(dir / "a.lsck").permissions() & fs::perms::all);
    CHECK(mode == (0666u & ~static_cast<unsigned>(mask)));
  }
  // A directory in the place of a checkpoint: refused by name, not a stream's exception.
  fs::create_directories(dir / "b.lsck");
  std::string msg;
  try {
    (void)ls::load_checkpoint(dir / "b.lsck", ls::model_signature<small_net>());
  } catch (const ls::checkpoint_error& e) {
    msg = e.what();
  }
  CAPTURE(msg);
  CHECK(msg.find((dir / "b.lsck").string()) != std::string::npos);
  CHECK(msg.find("is a directory") != std::string::npos);
  // ... and the manager lists files only: a directory named as the newest checkpoint is not latest().
  ls::checkpoint_manager mgr(dir / "run", 3);
  auto t = sample_state();
  t.step = 4;
  mgr.save(t);
  fs::create_directories(dir / "run" / "ckpt-000000000009.lsck");
  CHECK(mgr.list().size() == 1);
  CHECK(mgr.latest() == mgr.path_for(4));
  CHECK(ls::checkpoint_state::from_file(*mgr.load_latest(ls::model_signature<small_net>())).step == 4);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint_manager: step_of reads back the step of path_for, and 0 from other names") {
  ls::checkpoint_manager mgr(temp_dir("step_of"), 1);
  for (std::uint64_t step : {0ull, 1ull, 7ull, 999'999'999'999ull, 1'000'000'000'000ull, 18'446'744'073'709'551'615ull}) {
    CAPTURE(step);
    CHECK(ls::checkpoint_manager::step_of(mgr.path_for(step)) == step);
  }
  for (const char* other : {"", "ckpt-", "model.lsck", "xkpt-000000000005.lsck", "ckpt-abc.lsck"}) {
    CAPTURE(other);
    CHECK(ls::checkpoint_manager::step_of(other) == 0);
  }
  fs::remove_all(mgr.directory());
}

TEST_CASE("checkpoint: empty arrays and strings round-trip") {
  // A checkpoint taken before the first update has no optimiser state; callbacks may save none.
  auto s = sample_state();
  s.optimizer_state.clear();
  s.callback_states = {{}, {}, {}};
  s.model_name.clear();
  for (int pass = 0; pass < 2; ++pass) {
    CAPTURE(pass);
    const auto t = ls::decode_checkpoint(ls::encode_checkpoint(s), "mem");
    CHECK(t.optimizer_state.empty());
    CHECK(t.callback_states == s.callback_states);
    CHECK(t.model_name.empty());
    CHECK(t.parameters == s.parameters);
    s.callback_states.clear();
    s.parameters.clear();
  }
}

namespace {

// `b` with the CRC of section `sec` recomputed (after a deliberate change of its payload).
void fix_crc(std::vector<std::uint8_t>& b, const span_of& sec) {
  const std::uint32_t crc = ls::io::crc32_of(std::span<const std::uint8_t>(b.data() + sec.begin, sec.end - 4 - sec.begin));
  std::memcpy(b.data() + sec.end - 4, &crc, 4);
}

span_of section(const std::vector<std::uint8_t>& b, const std::string& name) {
  for (const auto& s : layout(b))
    if (s.name == name) return s;
  FAIL("no section " << name);
  return {};
}

}  // namespace

TEST_CASE("checkpoint: meaningless rates and counts are refused at the offset of the field, non-finite epoch sums kept") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct bad_case {
    const char* what;
    void (*change)(ls::checkpoint_state&);
    const char* section;
    std::size_t field_offset;  // in the payload
    const char* expect;
  };
  static float bad_value;
  const std::vector<bad_case> cases = {
      {"base lr", [](ls::checkpoint_state& s) { s.base_lr = bad_value; }, "fit", 16, "the base learning rate is "},
      {"lr factor", [](ls::checkpoint_state& s) { s.lr_factor = bad_value; }, "fit", 20, "the learning-rate factor is "},
      {"lr", [](ls::checkpoint_state& s) { s.lr = bad_value; }, "fit", 24, "the learning rate is "},
  };
  for (float v : {nan, -nan, inf, -inf, -1e-3f, -0.5f}) {
    CAPTURE(v);
    bad_value = v;
    for (const auto& c : cases) {
      CAPTURE(c.what);
      auto s = sample_state();
      c.change(s);
      const auto b = ls::encode_checkpoint(s);
      const auto sec = section(b, c.section);
      const std::string msg = message_of(b);
      CAPTURE(msg);
      CHECK(msg.find("section 'fit' at offset " + std::to_string(payload_of(sec) + c.field_offset) + ": " + c.expect) !=
            std::string::npos);
      CHECK(msg.find("not a finite value >= 0") != std::string::npos);
    }
  }
  // zero rates are meaningful (a factor driven to 0, a finished schedule)
  auto z = sample_state();
  z.base_lr = z.lr_factor = z.lr = 0;
  CHECK(message_of(ls::encode_checkpoint(z)).empty());

  // Epoch sums that are not finite are statistics of a run that happened (a loss that overflowed,
  // NaN under nonfinite = apply): they round-trip, so the resumed epoch reports what it would have.
  for (const double v : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity()}) {
    CAPTURE(v);
    auto t = sample_state();
    t.epoch_loss_sum = v;
    t.epoch_norm_sum = v;
    t.epoch_clip_sum = v;
    t.epoch_norm_updates = 1;
    const auto back = ls::decode_checkpoint(ls::encode_checkpoint(t), "mem");
    CHECK(std::memcmp(&back.epoch_loss_sum, &v, sizeof v) == 0);
    CHECK(std::memcmp(&back.epoch_norm_sum, &v, sizeof v) == 0);
    CHECK(std::memcmp(&back.epoch_clip_sum, &v, sizeof v) == 0);
  }
  auto s = sample_state();
  auto b = ls::encode_checkpoint(s);
  auto sec = section(b, "fit");
  s = sample_state();
  s.epoch_correct = s.epoch_labelled + 1;
  b = ls::encode_checkpoint(s);
  CHECK(message_of(b).find("section 'fit' at offset " + std::to_string(payload_of(sec) + 48 + 1 + 32) +
                           ": the epoch's top-1 hits (81) exceed its labelled rows (80)") != std::string::npos);
}

TEST_CASE("checkpoint: value errors name the offset of the bad field") {
  const auto good = ls::encode_checkpoint(sample_state());
  // the stop flag: after the position, rates, seeds and replicas of the fit section
  auto sec = section(good, "fit");
  auto b = good;
  b[payload_of(sec) + 48] = 7;
  fix_crc(b, sec);
  CHECK(message_of(b).find("section 'fit' at offset " + std::to_string(payload_of(sec) + 48) + ": stop flag 7") !=
        std::string::npos);
  // the callback count, after the flag and five sums
  b = good;
  const std::uint64_t many = 1000;
  std::memcpy(b.data() + payload_of(sec) + 48 + 41, &many, 8);
  fix_crc(b, sec);
  CHECK(message_of(b).find("section 'fit' at offset " + std::to_string(payload_of(sec) + 48 + 41) + ": declares 1000") !=
        std::string::npos);
  // an element count larger than the section: named at the count itself
  sec = section(good, "optimizer");
  b = good;
  const std::uint64_t huge = 1ull << 60;
  std::memcpy(b.data() + payload_of(sec), &huge, 8);
  fix_crc(b, sec);
  CHECK(message_of(b).find("section 'optimizer' at offset " + std::to_string(payload_of(sec)) +
                           ": the optimizer state: declares " + std::to_string(huge)) != std::string::npos);
  // parameters that disagree with the model section's count: named at the array
  auto s = sample_state();
  s.parameters.pop_back();
  b = ls::encode_checkpoint(s);
  const std::uint64_t declared = ls::model<small_net>::param_count;
  const auto model = section(b, "model");
  std::memcpy(b.data() + payload_of(model) + 8, &declared, 8);
  fix_crc(b, model);
  sec = section(b, "parameters");
  CHECK(message_of(b).find("section 'parameters' at offset " + std::to_string(payload_of(sec)) + ": holds " +
                           std::to_string(declared - 1) + " parameters") != std::string::npos);
}

TEST_CASE("checkpoint: optimiser state of another kind of optimiser is refused, naming both") {
  constexpr std::size_t P = ls::model<small_net>::param_count;
  auto message = [&](const ls::checkpoint_state& s, const auto& opt) {
    try {
      ls::check_optimizer_state(s, opt, P, "m.lsck");
    } catch (const ls::checkpoint_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const ls::sgd momentum{.lr = 0.1f, .momentum = 0.9f};
  const ls::sgd plain{.lr = 0.1f};
  const ls::adam adam{};
  auto adam_state = sample_state();  // 2 values per parameter
  auto momentum_state = sample_state();
  momentum_state.optimizer_state.resize(P);
  auto no_state = sample_state();
  no_state.optimizer_state.clear();

  CHECK(message(adam_state, adam).empty());
  // Adam and AdamW keep the same amount of state: only the name tells them apart.
  std::string named = message(adam_state, ls::adamw{});
  CAPTURE(named);
  CHECK(named.find("written by lockstep::adam;") != std::string::npos);
  CHECK(named.find("this run's optimizer lockstep::adamw") != std::string::npos);
  auto unnamed = adam_state;  // formats 1 and 2 do not name it: the sizes are all that can be checked
  unnamed.optimizer_name.clear();
  CHECK(message(unnamed, ls::adamw{}).empty());
  adam_state.optimizer_name.clear();
  momentum_state.optimizer_name.clear();
  no_state.optimizer_name.clear();
  CHECK(message(momentum_state, momentum).empty());
  CHECK(message(no_state, plain).empty());

  std::string msg = message(momentum_state, adam);
  CAPTURE(msg);
  CHECK(msg.find("m.lsck: section 'optimizer'") != std::string::npos);
  CHECK(msg.find("holds " + std::to_string(P) + " optimizer state values after 1234 updates") != std::string::npos);
  CHECK(msg.find("(lockstep::sgd with momentum)") != std::string::npos);
  CHECK(msg.find("this run's optimizer lockstep::adam keeps " + std::to_string(2 * P)) != std::string::npos);

  msg = message(adam_state, momentum);
  CHECK(msg.find("(lockstep::adam or lockstep::adamw)") != std::string::npos);
  CHECK(msg.find("lockstep::sgd with momentum 0.9") != std::string::npos);
  CHECK(!message(adam_state, plain).empty());
  CHECK(message(no_state, adam).find("keeps no state") != std::string::npos);
  // before the first applied update no optimiser has state yet: any optimiser may start from it
  // (step 0, or every update so far skipped by the non-finite guard, which on host replicas
  // leaves the optimiser untouched); one applied update needs the state
  no_state.skipped_updates = no_state.step;
  CHECK(message(no_state, adam).empty());
  CHECK(message(no_state, momentum).empty());
  no_state.skipped_updates = no_state.step - 1;
  CHECK(message(no_state, adam).find("holds 0 optimizer state values after 1234 updates") != std::string::npos);
  no_state.step = 0;
  no_state.skipped_updates = 0;
  CHECK(message(no_state, adam).empty());
  CHECK(message(no_state, momentum).empty());
  auto odd = sample_state();
  odd.optimizer_state.resize(P + 1);
  CHECK(message(odd, adam).find("not a whole number per parameter") != std::string::npos);
}

TEST_CASE("checkpoint: the guard's counters are refused when they exceed the updates, at the offset of the field") {
  auto s = sample_state();
  s.skipped_updates = s.step;  // every update skipped: valid
  s.consecutive_skips = s.step;
  CHECK(message_of(ls::encode_checkpoint(s)).empty());
  s.skipped_updates = s.step + 1;
  const auto b = ls::encode_checkpoint(s);
  const std::string msg = message_of(b);
  CAPTURE(msg);
  CHECK(msg.find("section 'guard' at offset " + std::to_string(payload_of(section(b, "GARD"))) +
                 ": the skipped updates (1235) exceed the updates (1234)") != std::string::npos);
  s.skipped_updates = 5;
  s.consecutive_skips = 6;
  const auto c = ls::encode_checkpoint(s);
  CHECK(message_of(c).find("section 'guard' at offset " + std::to_string(payload_of(section(c, "GARD")) + 8) +
                           ": the consecutive skipped updates (6) exceed all skipped (5)") != std::string::npos);
}
