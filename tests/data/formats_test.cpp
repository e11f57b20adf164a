// The index-first file formats of the core: tar archives read by offset (ustar, GNU long names,
// pax) grouped as WebDataset samples, and memory-mapped .npy arrays; every malformed input is a
// data_error naming the file and where.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <lockstep/data.hpp>

#include "data/tar_writer.hpp"

namespace ld = lockstep::data;
namespace fs = std::filesystem;

namespace {

// A scratch folder removed at the end of the test.
struct scratch {
  fs::path dir;
  scratch() {
    std::string p = (fs::temp_directory_path() / "lockstep-formats-XXXXXX").string();
    REQUIRE(::mkdtemp(p.data()) != nullptr);
    dir = p;
  }
  ~scratch() { fs::remove_all(dir); }
  std::string write(const std::string& name, const std::vector<std::uint8_t>& b) const {
    const auto p = (dir / name).string();
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    return p;
  }
};

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A .npy file: header of `version` (1 or 2) with the dict text, then the data.
std::vector<std::uint8_t> npy_file(const std::string& dict, const std::vector<std::uint8_t>& data, int version = 1) {
  std::vector<std::uint8_t> out{0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<std::uint8_t>(version), 0};
  const std::size_t pre = version == 1 ? 10 : 12;
  std::string h = dict;
  while ((pre + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  for (int k = 0; k < (version == 1 ? 2 : 4); ++k) out.push_back(static_cast<std::uint8_t>(h.size() >> (8 * k)));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <class T>
std::vector<std::uint8_t> raw(const std::vector<T>& v) {
  std::vector<std::uint8_t> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lockstep::data_error& e) {
    return e.what();
  }
  return "(no data_error)";
}

}  // namespace

TEST_CASE("tar: headers are indexed, members read by offset, WebDataset samples grouped") {
  scratch s;
  tar_test::writer w;
  w.add("shard/a.png", std::string(700, 'x'));
  w.add("shard/a.cls", "3\n");
  w.add("shard/", std::vector<std::uint8_t>{}, '5');  // a directory: skipped
  w.add("shard/b.seg.png", "seg");
  w.add("shard/b.jpg", "jpeg");
  const std::string long_name = "deep/" + std::string(120, 'n') + ".png";
  w.add(long_name, "long");
  w.pax({{"path", "pax/c.cls"}});
  w.add("ignored-name", "7");
  const auto path = s.write("s.tar", w.finish());
  const ld::tar_index idx = ld::scan_tar(path);
  REQUIRE(idx.members.size() == 6);
  CHECK(idx.members[0].name == "shard/a.png");
  CHECK(idx.members[0].size == 700);
  CHECK(idx.members[0].offset == 512);
  CHECK(idx.members[4].name == long_name);
  CHECK(idx.members[5].name == "pax/c.cls");
  // Ten headers (the long name and the pax record have their own) and the end block, the long
  // name (130 bytes) and the pax record (18 bytes): never a member's data.
  CHECK(idx.bytes_read == 10 * 512 + 130 + 18);
  const auto samples = ld::webdataset_samples(idx, path);
  REQUIRE(samples.size() == 4);
  CHECK(samples[0].key == "shard/a");
  CHECK(samples[0].fields.size() == 2);
  CHECK(samples[1].key == "shard/b");
  REQUIRE(samples[1].field("seg.png"));
  REQUIRE(samples[1].field("jpg"));
  ld::detail::file_handle fd = ld::detail::open_read(path, "test");
  std::vector<std::uint8_t> got;
  ld::read_member(fd.get(), path, idx.members[1], got);
  CHECK(got == bytes("3\n"));
  ld::read_member(fd.get(), path, idx.members[*samples[1].field("jpg")], got);
  CHECK(got == bytes("jpeg"));
}

TEST_CASE("tar: compressed, damaged and unsupported archives are refused, naming file, member and offset") {
  scratch s;
  tar_test::writer w;
  w.add("a.png", std::string(1000, 'p'));
  w.add("a.cls", "1");
  const auto good = w.finish();
  // gzip: refused with the command that fixes it.
  std::vector<std::uint8_t> gz{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  const auto m1 = message_of([&] { (void)ld::scan_tar(s.write("x.tar", gz)); });
  CHECK(m1.find("gzip-compressed") != std::string::npos);
  CHECK(m1.find("gunzip") != std::string::npos);
  // A damaged header.
  auto bad = good;
  bad[20] ^= 0x40;
  const auto m2 = message_of([&] { (void)ld::scan_tar(s.write("bad.tar", bad)); });
  CHECK(m2.find("byte offset 0") != std::string::npos);
  CHECK(m2.find("checksum") != std::string::npos);
  // Truncated inside the first member's data.
  auto cut = good;
  cut.resize(900);
  const auto m3 = message_of([&] { (void)ld::scan_tar(s.write("cut.tar", cut)); });
  CHECK(m3.find("member 'a.png'") != std::string::npos);
  CHECK(m3.find("truncated") != std::string::npos);
  // A symbolic link member cannot be read by offset.
  tar_test::writer l;
  l.add("a.png", std::vector<std::uint8_t>{}, '2');
  CHECK(message_of([&] { (void)ld::scan_tar(s.write("link.tar", l.finish())); }).find("only regular files") != std::string::npos);
  // WebDataset: a name without an extension, a key that comes back, an extension twice.
  for (const auto& names : {std::vector<std::string>{"noext"}, std::vector<std::string>{"a.png", "b.png", "a.cls"},
                            std::vector<std::string>{"a.png", "a.png"}}) {
    tar_test::writer x;
    for (const auto& n : names) x.add(n, "d");
    const auto p = s.write("wds.tar", x.finish());
    const auto idx = ld::scan_tar(p);
    CHECK_THROWS_AS((void)ld::webdataset_samples(idx, p), lockstep::data_error);
  }
  // Limits.
  CHECK_THROWS_AS((void)ld::scan_tar(s.write("g.tar", good), {.max_members = 1}), lockstep::data_error);
  CHECK_THROWS_AS((void)ld::scan_tar(s.write("g.tar", good), {.max_member_bytes = 999}), lockstep::data_error);
  CHECK_THROWS_AS((void)ld::scan_tar((s.dir / "missing.tar").string()), lockstep::data_error);
  // An empty file is an empty archive; the end of the file at a header boundary ends it.
  CHECK(ld::scan_tar(s.write("empty.tar", {})).members.empty());
  auto unterminated = good;
  unterminated.resize(unterminated.size() - 1024);
  CHECK(ld::scan_tar(s.write("unterminated.tar", unterminated)).members.size() == 2);
}

TEST_CASE("npy: rows and labels, uint8 and float32, versions 1 and 2, served like a table") {
  scratch s;
  const std::size_t n = 23;
  std::vector<std::uint8_t> pix(n * 4 * 3);
  for (std::size_t i = 0; i < pix.size(); ++i) pix[i] = static_cast<std::uint8_t>(i * 7);
  std::vector<std::int64_t> lab(n);
  for (std::size_t i = 0; i < n; ++i) lab[i] = static_cast<std::int64_t>(i % 5);
  std::vector<float> fl(n * 3);
  for (std::size_t i = 0; i < fl.size(); ++i) fl[i] = static_cast<float>(i) * 0.5f - 7;
  const auto x = s.write("x.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (23, 4, 3), }", pix));
  const auto y = s.write("y.npy", npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (23,), }", raw(lab), 2));
  const auto f = s.write("f.npy", npy_file("{\"shape\": (23, 3), \"fortran_order\": False, \"descr\": \"<f4\"}", raw(fl)));
  auto t = std::make_shared<ld::table>();
  t->rows = n;
  t->width = 12;
  t->bytes = pix;
  for (auto l : lab) t->labels.push_back(static_cast<std::int32_t>(l));
  const auto ref = ld::from_table(t) | ld::map(ld::scale(0.5f)) | ld::shuffle(23, 2) | ld::batched(5) | ld::shard_batches(2);
  const auto got = ld::npy(x, y) | ld::map(ld::scale(0.5f)) | ld::shuffle(23, 2) | ld::batched(5) | ld::shard_batches(2);
  std::vector<std::vector<float>> a, b;
  std::vector<std::vector<std::int32_t>> la, lb;
  for (auto&& d : ref.epoch(0))
    for (const auto& sh : d.shards) {
      a.emplace_back(sh.features, sh.features + sh.size * sh.width);
      la.emplace_back(sh.labels, sh.labels + sh.size);
    }
  for (auto&& d : got.epoch(0))
    for (const auto& sh : d.shards) {
      b.emplace_back(sh.features, sh.features + sh.size * sh.width);
      lb.emplace_back(sh.labels, sh.labels + sh.size);
    }
  CHECK(a == b);
  CHECK(la == lb);
  std::vector<float> seen;
  for (auto&& d : (ld::npy(f) | ld::batched(23) | ld::shard_batches(1)).epoch(0))
    seen.assign(d.shards[0].features, d.shards[0].features + 69);
  CHECK(seen == fl);
  // As images (N, H, W, C) = (23, 2, 2, 3): a flip mirrors the columns.
  const auto xi = s.write("xi.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (23, 2, 2, 3), }", pix));
  const auto img = ld::npy(xi, y, {.layout = ld::npy_layout::hwc}) | ld::random_flip(1, 1.0) | ld::batched(23) | ld::shard_batches(1);
  for (auto&& d : img.epoch(0)) {
    const ld::shard& sh = d.shards[0];
    CHECK(sh.width == 12);
    // sample 1, channel 1, row 1, column 0 (channels-first) is the file's pixel (row 1, column 1, channel 1)
    CHECK(sh.features[12 + 1 * 4 + 1 * 2 + 0] == static_cast<float>(pix[12 + (1 * 2 + 1) * 3 + 1]));
  }
  CHECK_THROWS_AS(ld::npy(x, y, {.layout = ld::npy_layout::chw}), lockstep::config_error);  // rank 3
}

TEST_CASE("npy: malformed files are refused naming the file and offset") {
  scratch s;
  const std::vector<std::uint8_t> four{1, 2, 3, 4};
  const auto err = [&](const std::vector<std::uint8_t>& file) {
    return message_of([&] { (void)ld::npy(s.write("e.npy", file)); });
  };
  CHECK(err(bytes("not numpy at all")).find("bad magic") != std::string::npos);
  CHECK(err(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", four)).find("big-endian") != std::string::npos);
  CHECK(err(npy_file("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2), }", four)).find("Fortran") != std::string::npos);
  CHECK(err(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", four)).find("declares 6 data bytes") != std::string::npos);
  CHECK(err(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", four)).find("declares 3") != std::string::npos);
  CHECK(err(npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", four)).find("structured") != std::string::npos);
  CHECK(err(npy_file("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", four)).find("uint8 or float32") != std::string::npos);
  CHECK(err(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), 'x': 1}", four)).find("unknown header key") != std::string::npos);
  CHECK(err(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999,), }", four)).find("byte offset") != std::string::npos);
  CHECK(err(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (), }", four)).find("0-dimensional") != std::string::npos);
  auto big = npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", four);
  big[8] = 0xff;
  big[9] = 0xff;
  CHECK(err(big).find("truncated header") != std::string::npos);
  const auto x = s.write("x.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", four));
  const auto labels = [&](const std::string& dict, const std::vector<std::uint8_t>& data) {
    return message_of([&] { (void)ld::npy(x, s.write("l.npy", npy_file(dict, data))); });
  };
  CHECK(labels("{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", {1, 2, 3}).find("3 labels") != std::string::npos);
  CHECK(labels("{'descr': '|i1', 'fortran_order': False, 'shape': (4,), }", {1, 2, 0xff, 3}).find("label 2 is negative") != std::string::npos);
  CHECK(labels("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", four).find("must be integers") != std::string::npos);
}
