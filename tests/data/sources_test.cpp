// Tests of the sources: in-memory tables, IDX (plain and gzip; malformed files), CSV, and the
// real Fashion-MNIST files when installed.
#include <doctest/doctest.h>

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

#include <lockstep/data.hpp>

namespace ld = lockstep::data;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed at scope exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("lockstep_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  [[nodiscard]] std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_be32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

// An IDX uint8 file image: magic, dims, then data (pattern (i * 7 + 3) % 256).
std::vector<std::uint8_t> idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims, std::size_t data) {
  std::vector<std::uint8_t> out;
  put_be32(out, magic);
  for (auto d : dims) put_be32(out, d);
  for (std::size_t i = 0; i < data; ++i) out.push_back(static_cast<std::uint8_t>((i * 7 + 3) % 256));
  return out;
}

void write_plain(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty()) REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  gzclose(f);
}

std::vector<std::uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const lockstep::data_error& e) {
    return e.what();
  }
  return "<no data_error>";
}

}  // namespace

TEST_CASE("from_memory: views over the table, validation of sizes") {
  const auto d = ld::from_memory(std::vector<float>{1, 2, 3, 4, 5, 6}, 3, std::vector<std::int32_t>{0, 9});
  std::vector<ld::sample> got;
  for (auto&& s : d.epoch()) got.push_back(s);
  REQUIRE(got.size() == 2);
  CHECK(got[1].index == 1);
  CHECK(got[1].label == 9);
  CHECK(got[1].feature(2) == 6.0f);
  CHECK(ld::owned_sample(got[0]).features == std::vector<float>{1, 2, 3});
  CHECK_THROWS_AS(ld::from_memory(std::vector<float>{1, 2, 3, 4}, 3), lockstep::data_error);
  CHECK_THROWS_AS(ld::from_memory(std::vector<float>{1, 2, 3}, 3, std::vector<std::int32_t>{0, 1}), lockstep::data_error);
  CHECK_THROWS_AS(ld::from_memory(std::vector<float>{1, 2, 3}, 3, std::vector<std::int32_t>{-2}), lockstep::data_error);
  std::size_t rows = 0;
  for (auto&& s : ld::from_rows(std::vector<float>(35, 1.0f), 5).epoch()) rows += (s.label == ld::no_label);
  CHECK(rows == 7);
}

TEST_CASE("idx: plain and gzip files decode to the same samples, for several shapes") {
  temp_dir dir;
  for (std::uint32_t count : {0u, 1u, 3u, 17u})
    for (bool gz : {false, true}) {
      CAPTURE(count);
      CAPTURE(gz);
      const auto images = idx_bytes(0x803, {count, 2, 3}, count * 6);
      std::vector<std::uint8_t> labels = idx_bytes(0x801, {count}, 0);
      for (std::uint32_t i = 0; i < count; ++i) labels.push_back(static_cast<std::uint8_t>(i % 10));
      const std::string ip = dir.file(gz ? "img.gz" : "img"), lp = dir.file(gz ? "lab.gz" : "lab");
      (gz ? write_gz : write_plain)(ip, images);
      (gz ? write_gz : write_plain)(lp, labels);
      std::size_t n = 0;
      for (auto&& s : (ld::idx(ip, lp) | ld::map(ld::scale(2.0f))).epoch()) {
        CHECK(s.index == n);
        CHECK(s.width == 6);
        CHECK(s.label == static_cast<std::int32_t>(n % 10));
        for (std::size_t j = 0; j < 6; ++j)
          CHECK(s.feature(j) == 2.0f * static_cast<float>(images[16 + n * 6 + j]));
        ++n;
      }
      CHECK(n == count);
      std::size_t unlabelled = 0;
      for (auto&& s : ld::idx(ip).epoch()) unlabelled += (s.label == ld::no_label);
      CHECK(unlabelled == count);
    }
}

TEST_CASE("idx: malformed files raise data_error naming the file and the byte offset") {
  temp_dir dir;
  const auto good_labels = [] {
    auto v = idx_bytes(0x801, {4}, 0);
    for (int i = 0; i < 4; ++i) v.push_back(1);
    return v;
  }();
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    auto write = gz ? write_gz : write_plain;
    const std::string lp = dir.file("labels"), ip = dir.file("images");
    write(lp, good_labels);

    struct bad_case {
      const char* what;
      std::vector<std::uint8_t> bytes;
      const char* expect;
    };
    const std::vector<bad_case> cases = {
        {"empty file", {}, "byte offset 0"},
        {"short magic", {0, 0, 8}, "byte offset 3"},
        {"wrong magic", idx_bytes(0x801, {4}, 4), "byte offset 0: bad magic 0x00000801"},
        {"wrong element type", idx_bytes(0x0d03, {4, 2, 2}, 16), "byte offset 0: bad magic 0x00000d03"},
        {"not idx", idx_bytes(0x12345678, {4, 2, 2}, 16), "not an IDX file"},
        {"truncated dims", [] { auto v = idx_bytes(0x803, {4, 2}, 0); return v; }(), "byte offset 12"},
        {"zero dimension", idx_bytes(0x803, {4, 0, 2}, 0), "byte offset 8"},
        {"truncated data", idx_bytes(0x803, {4, 2, 2}, 15), "byte offset 31"},
        {"trailing bytes", idx_bytes(0x803, {4, 2, 2}, 17), "byte offset 32: trailing"},
    };
    for (const auto& c : cases) {
      CAPTURE(c.what);
      write(ip, c.bytes);
      const std::string msg = error_of([&] { (void)ld::idx(ip, lp); });
      CHECK(msg.find(ip) != std::string::npos);
      CHECK(msg.find(c.expect) != std::string::npos);
      CAPTURE(msg);
    }
    // wrong count: 5 images, 4 labels
    write(ip, idx_bytes(0x803, {5, 2, 2}, 20));
    const std::string msg = error_of([&] { (void)ld::idx(ip, lp); });
    CAPTURE(msg);
    CHECK(msg.find("5 images") != std::string::npos);
    CHECK(msg.find("4 labels") != std::string::npos);
    CHECK(msg.find(ip) != std::string::npos);
    CHECK(msg.find(lp) != std::string::npos);
    // labels file with images magic
    write(ip, idx_bytes(0x803, {4, 2, 2}, 16));
    write(lp, idx_bytes(0x803, {4, 2, 2}, 16));
    CHECK(error_of([&] { (void)ld::idx(ip, lp); }).find("expected 0x00000801") != std::string::npos);
  }
  CHECK(error_of([&] { (void)ld::idx(dir.file("missing.gz")); }).find("cannot open") != std::string::npos);
}

TEST_CASE("idx: corrupt and truncated gzip streams raise data_error with the byte offset") {
  temp_dir dir;
  const std::string ip = dir.file("images.gz");
  const auto images = idx_bytes(0x803, {200, 28, 28}, 200 * 784);
  write_gz(ip, images);
  const auto good = read_all(ip);
  REQUIRE(good.size() > 100);

  // flipped bytes in the middle of the deflate stream, and a changed CRC in the trailer
  for (std::size_t at : {good.size() / 3, good.size() / 2, good.size() - 8}) {
    CAPTURE(at);
    auto bad = good;
    bad[at] ^= 0x5a;
    bad[at + 1] ^= 0xff;
    write_plain(ip, bad);
    const std::string msg = error_of([&] { (void)ld::idx(ip); });
    CAPTURE(msg);
    CHECK(msg.find(ip) != std::string::npos);
    CHECK(msg.find("byte offset") != std::string::npos);
  }
  // a compressed file cut short
  for (std::size_t keep : {std::size_t{12}, good.size() / 2, good.size() - 3}) {
    CAPTURE(keep);
    write_plain(ip, std::vector<std::uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(keep)));
    const std::string msg = error_of([&] { (void)ld::idx(ip); });
    CAPTURE(msg);
    CHECK(msg.find(ip) != std::string::npos);
    CHECK(msg.find("byte offset") != std::string::npos);
  }
}

TEST_CASE("csv: numbers, header, label column, blank lines") {
  temp_dir dir;
  const std::string p = dir.file("data.csv");
  std::ofstream(p) << "a,b,label,c\n1.5, 2 ,3,-4e1\r\n\n+0.25,5,0,6\n";
  const auto d = ld::csv(p, {.header = true, .label_column = 2});
  std::vector<ld::owned_sample> rows;
  for (auto&& s : d.epoch()) rows.emplace_back(s);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].features == std::vector<float>{1.5f, 2, -40});
  CHECK(rows[0].label == 3);
  CHECK(rows[1].features == std::vector<float>{0.25f, 5, 6});
  CHECK(rows[1].label == 0);
  CHECK(rows[1].index == 1);

  std::ofstream(p) << "1,2\n3,4\n5,6";  // no final newline, no header, no labels
  std::size_t n = 0;
  for (auto&& s : ld::csv(p).epoch()) n += (s.width == 2 && s.label == ld::no_label);
  CHECK(n == 3);
}

TEST_CASE("csv: malformed rows raise data_error naming file, line and column") {
  temp_dir dir;
  const std::string p = dir.file("bad.csv");
  struct bad_case {
    const char* text;
    ld::csv_options options;
    const char* where;
  };
  const std::vector<bad_case> cases = {
      {"1,2,3\n4,x,6\n", {}, ":2:2: 'x' is not a number"},
      {"1,2,3\n4,,6\n", {}, ":2:2: missing value"},
      {"1,2,3\n4,5\n", {}, ":2:3: missing field"},
      {"1,2,3\n4,5,6,7\n", {}, ":2:4: extra field"},
      {"h1,h2\n1,2\n\n3,4abc\n", {.header = true}, ":4:2: '4abc' is not a number"},
      {"1,2\n3,2.5\n", {.label_column = 1}, ":2:2: label '2.5'"},
      {"1,-1\n", {.label_column = 1}, ":1:2: label '-1'"},
      {"1,2\n", {.label_column = 5}, ":1: label column 5 does not exist"},
      {"1;2\n3;x\n", {.delimiter = ';'}, ":2:2:"},
      {"1,2\n3,nan\n", {}, ":2:2: 'nan' is not a finite number"},
      {"1,2\ninf,4\n", {}, ":2:1: 'inf' is not a finite number"},
      {"1,-INF\n", {}, ":1:2: '-INF' is not a finite number"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    std::ofstream(p) << c.text;
    const std::string msg = error_of([&] { (void)ld::csv(p, c.options); });
    CAPTURE(msg);
    CHECK(msg.find(p + c.where) != std::string::npos);
  }
  CHECK(error_of([&] { (void)ld::csv(dir.file("none.csv")); }).find("cannot open") != std::string::npos);
}

TEST_CASE("idx: the real Fashion-MNIST training set") {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  const std::string images = dir + "/train-images-idx3-ubyte.gz", labels = dir + "/train-labels-idx1-ubyte.gz";
  if (!fs::exists(images) || !fs::exists(labels)) {
    MESSAGE("Fashion-MNIST not installed under " << dir << " (package dataset-fashion-mnist); skipped");
    return;
  }
  const auto d = ld::idx(images, labels) | ld::map(ld::scale(1.0f / 255)) | ld::batched(1000);
  std::size_t rows = 0;
  std::vector<std::size_t> per_class(10, 0);
  float lo = 1, hi = 0;
  for (auto&& b : d.epoch()) {
    CHECK(b.width == 784);
    rows += b.rows();
    for (auto l : b.labels) {
      REQUIRE((l >= 0 && l <= 9));
      ++per_class[static_cast<std::size_t>(l)];
    }
    const auto [mn, mx] = std::minmax_element(b.features.begin(), b.features.end());
    lo = std::min(lo, *mn);
    hi = std::max(hi, *mx);
  }
  CHECK(rows == 60000);
  for (auto c : per_class) CHECK(c == 6000);  // Fashion-MNIST is balanced
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
}
