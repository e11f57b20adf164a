// The index-first file formats of the core: tar archives read by offset (ustar, GNU long names,
// pax) grouped as WebDataset samples, and .npy arrays; every malformed input is a
// data_error naming the file and where.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
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
  // Nine headers (the long name and the pax record have their own) and the two end blocks, the
  // long name (130 bytes) and the pax record (18 bytes): never a member's data.
  CHECK(idx.bytes_read == 11 * 512 + 130 + 18);
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
  // As (N, C, H, W) = (23, 3, 2, 2): the features, channels-first, are the file's bytes.
  const auto xc = s.write("xc.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (23, 3, 2, 2), }", pix));
  for (auto&& d : (ld::npy(xc, y, {.layout = ld::npy_layout::chw}) | ld::batched(23) | ld::shard_batches(1)).epoch(0)) {
    const ld::shard& sh = d.shards[0];
    REQUIRE(sh.width == 12);
    REQUIRE(sh.size == n);
    for (std::size_t i = 0; i < n * 12; ++i) CHECK(sh.features[i] == static_cast<float>(pix[i]));
  }
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
  CHECK(err(npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999,), }", four)).find("a dimension is too large") != std::string::npos);
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

TEST_CASE("npy: a file that shrinks after it was opened fails the load of a lost row, naming the file, row and offset") {
  scratch s;
  const std::size_t n = 23;
  std::vector<std::uint8_t> pix(n * 12);
  for (std::size_t i = 0; i < pix.size(); ++i) pix[i] = static_cast<std::uint8_t>(i * 7);
  std::vector<float> fl(n * 3);
  for (std::size_t i = 0; i < fl.size(); ++i) fl[i] = static_cast<float>(i) * 0.5f - 7;
  struct kind {
    std::string name;                // file name
    std::vector<std::uint8_t> file;  // its bytes
    ld::npy_layout layout;           // how its rows are read
    std::size_t row_bytes;           // bytes per row
  };
  const std::vector<kind> kinds{
      {"rows.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (23, 12), }", pix), ld::npy_layout::rows, 12},
      {"floats.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (23, 3), }", raw(fl), 2), ld::npy_layout::rows, 12},
      {"chw.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (23, 3, 2, 2), }", pix), ld::npy_layout::chw, 12},
      {"hwc.npy", npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (23, 2, 2, 3), }", pix), ld::npy_layout::hwc, 12}};
  for (const kind& k : kinds)
    for (const std::size_t cut : {std::size_t{0}, std::size_t{5}, std::size_t{11}}) {
      CAPTURE(k.name);
      CAPTURE(cut);
      const std::string path = s.write(k.name, k.file);
      const auto rows = ld::npy(path, {.layout = k.layout, .load = {.threads = 1}});  // opened whole
      const std::size_t header = k.file.size() - n * k.row_bytes;
      fs::resize_file(path, header + 10 * k.row_bytes + cut);  // rows 0-9 stay, row 10 loses 12 - cut bytes
      std::size_t seen = 0;
      const auto m = message_of([&] {
        for (auto&& b : (rows | ld::batched(1) | ld::shard_batches(1)).epoch(0)) seen += b.shards[0].size;
      });
      CHECK(seen == 10);
      CHECK(m.find(path) != std::string::npos);
      CHECK(m.find("byte offset " + std::to_string(header + 10 * k.row_bytes)) != std::string::npos);
      CHECK(m.find("row 10 is truncated (" + std::to_string(cut) + " of 12 bytes)") != std::string::npos);
      CHECK(m.find("shrunk since it was opened") != std::string::npos);
    }
  // A header longer than the first read (4096 bytes) is read whole.
  std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (23, 12), ";
  dict.append(5000, ' ');
  dict += "}";
  std::vector<float> seen;
  for (auto&& b : (ld::npy(s.write("long.npy", npy_file(dict, pix, 2))) | ld::batched(23) | ld::shard_batches(1)).epoch(0))
    seen.assign(b.shards[0].features, b.shards[0].features + n * 12);
  REQUIRE(seen.size() == pix.size());
  for (std::size_t i = 0; i < pix.size(); ++i) CHECK(seen[i] == static_cast<float>(pix[i]));
}

TEST_CASE("tar: a lone zero block, an extended header without its member and a sparse member are refused") {
  scratch s;
  tar_test::writer w;
  w.add("a.cls", "1");
  w.add("b.cls", "2");
  const auto good = w.finish();  // a.cls at 0, b.cls at 1024, the end blocks at 2048
  // A zero block between the members would end the archive and drop b.cls.
  auto lone = good;
  lone.insert(lone.begin() + 1024, 512, 0);
  const auto m1 = message_of([&] { (void)ld::scan_tar(s.write("lone.tar", lone)); });
  CHECK(m1.find("lone.tar") != std::string::npos);
  CHECK(m1.find("byte offset 1024") != std::string::npos);
  CHECK(m1.find("lone zero block") != std::string::npos);
  // One zero block at the end of the file, or two, end it.
  auto one_end = good;
  one_end.resize(one_end.size() - 512);
  CHECK(ld::scan_tar(s.write("one-end.tar", one_end)).members.size() == 2);
  CHECK(ld::scan_tar(s.write("good.tar", good)).members.size() == 2);
  // A GNU long name (at 1024) whose member is gone: end blocks, or the end of the file, after it.
  tar_test::writer l;
  l.add("a.cls", "1");
  l.add("dir/" + std::string(150, 'n') + ".cls", "2");  // the long name at 1024, its member at 2048
  auto long_end = l.finish();
  long_end.erase(long_end.begin() + 2048, long_end.begin() + 3072);
  // The archive `whole`, with its end blocks and with the last 1024 bytes cut (ending at the end
  // of the file), is refused naming the extended header at 1024.
  const auto no_member_at_1024 = [&](const std::vector<std::uint8_t>& whole, const char* name) {
    for (const std::size_t cut : {std::size_t{0}, std::size_t{1024}}) {
      auto b = whole;
      b.resize(b.size() - cut);
      CAPTURE(cut);
      const auto m = message_of([&] { (void)ld::scan_tar(s.write(name, b)); });
      CHECK(m.find("byte offset 1024") != std::string::npos);
      CHECK(m.find("has no member") != std::string::npos);
    }
  };
  no_member_at_1024(long_end, "long-end.tar");
  // A pax record (at 1024) with no member after it.
  tar_test::writer x;
  x.add("a.cls", "1");
  x.pax({{"path", "b.cls"}});
  no_member_at_1024(x.finish(), "pax-end.tar");
  // GNU sparse members: type 'S', and the pax format (GNU.sparse.* keys, GNUSparseFile.N/ names).
  tar_test::writer sp;
  sp.add("a.cls", "1");
  sp.add("b.bin", std::vector<std::uint8_t>{1, 2, 3}, 'S');
  const auto m2 = message_of([&] { (void)ld::scan_tar(s.write("sparse.tar", sp.finish())); });
  CHECK(m2.find("member 'b.bin'") != std::string::npos);
  CHECK(m2.find("byte offset 1024") != std::string::npos);
  CHECK(m2.find("sparse members are not supported") != std::string::npos);
  tar_test::writer px;
  px.pax({{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"}, {"GNU.sparse.name", "b.bin"}, {"GNU.sparse.realsize", "3"}});
  px.add("./GNUSparseFile.0/b.bin", "map");
  const auto m3 = message_of([&] { (void)ld::scan_tar(s.write("pax-sparse.tar", px.finish())); });
  CHECK(m3.find("member './GNUSparseFile.0/b.bin'") != std::string::npos);
  CHECK(m3.find("sparse members are not supported") != std::string::npos);
  tar_test::writer nm;  // the name alone, its pax record lost
  nm.add("d/GNUSparseFile.12/c.bin", "map");
  CHECK(message_of([&] { (void)ld::scan_tar(s.write("sparse-name.tar", nm.finish())); }).find("sparse") != std::string::npos);
  CHECK(ld::scan_tar(s.write("not-sparse.tar", [] {
          tar_test::writer ok;
          ok.add("d/GNUSparseFile.x/c.bin", "1");
          return ok.finish();
        }())).members.size() == 1);
}

TEST_CASE("tar: a pax size or GNU long name applies to the member, not to the extended header after it") {
  scratch s;
  tar_test::writer w;
  const std::string long_name = "dir/" + std::string(150, 'q') + ".cls";
  w.pax({{"size", "3"}});
  w.add(long_name, "abc");  // a GNU long-name record of 159 bytes, then the member
  const auto idx = ld::scan_tar(s.write("pax-long.tar", w.finish()));
  REQUIRE(idx.members.size() == 1);
  CHECK(idx.members[0].name == long_name);
  CHECK(idx.members[0].size == 3);
  CHECK(idx.members[0].offset == 5 * 512);  // after the pax header and record, the long name's, its own header
}

TEST_CASE("tar and npy: a named pipe is refused, not waited on") {
  scratch s;
  const std::string fifo = (s.dir / "pipe").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(message_of([&] { (void)ld::scan_tar(fifo); }).find("not a regular file") != std::string::npos);
  CHECK(message_of([&] { (void)ld::npy(fifo); }).find("not a regular file") != std::string::npos);
}

TEST_CASE("tar_writer: an exception leaves no archive and no .partial file, a finished writer its whole archive") {
  scratch s;
  const std::string p = (s.dir / "w.tar").string();
  try {
    ld::tar_writer w(p);
    w.add("a.cls", "1");
    throw std::runtime_error("interrupted");
  } catch (const std::runtime_error&) {
  }
  CHECK(!fs::exists(p));
  CHECK(!fs::exists(p + ".partial"));
  {
    ld::tar_writer w(p);
    w.add("a.cls", "1");
  }
  CHECK(!fs::exists(p + ".partial"));
  REQUIRE(fs::exists(p));
  CHECK(ld::scan_tar(p).members.size() == 1);
}
