// Tests of the sources: in-memory tables, IDX (plain and gzip; malformed files), CSV, and the
// real Fashion-MNIST files when installed.
#include <doctest/doctest.h>

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/resource.h>
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
  CHECK(error_of([&] { (void)ld::idx(dir.file("missing.gz")); }) ==
        "lockstep::data::idx: " + dir.file("missing.gz") + ": cannot open file: No such file or directory");
  // A directory opens but cannot be read: the reason is the operating system's.
  CHECK(error_of([&] { (void)ld::idx(dir.path.string()); }) ==
        "lockstep::data::idx: " + dir.path.string() + ": byte offset 0: read error: Is a directory");
  if (::geteuid() != 0) {  // root may read anything
    const std::string locked = dir.file("locked");
    write_plain(locked, idx_bytes(0x803, {1, 1, 1}, 1));
    fs::permissions(locked, fs::perms::none);
    CHECK(error_of([&] { (void)ld::idx(locked); }) ==
          "lockstep::data::idx: " + locked + ": cannot open file: Permission denied");
  }
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
      {"1,2\n3,2.5\n", {.label_column = 1}, ":2:2: label '2.5' is not an integer >= 0 (label_column 1, counted from 0)"},
      {"1,-1\n", {.label_column = 1}, ":1:2: label '-1' is not an integer >= 0 (label_column 1, counted from 0)"},
      {"1,2\n", {.label_column = 5},
       ":1: label_column 5 does not exist: columns are counted from 0, and the row has 2 fields (columns 0 to 1)"},
      {"1,2\n", {.label_column = 2}, ":1: label_column 2 does not exist: columns are counted from 0"},
      {"1,2,3\n", {.target_columns = {0, 3}}, ":1: target_columns names column 3, which does not exist: columns are "
                                               "counted from 0, and the row has 3 fields (columns 0 to 2)"},
      {"1,2,3\n4,x,6\n", {.target_columns = {1}}, ":2:2: 'x' is not a number (target column 1, counted from 0)"},
      {"1,2,3\n4,,6\n", {.label_column = 1}, ":2:2: missing value (empty field) (label_column 1, counted from 0)"},
      {"1;2\n3;x\n", {.delimiter = ';'}, ":2:2:"},
      {"1,2\n3,nan\n", {}, ":2:2: 'nan' is not a finite number"},
      {"1,2\ninf,4\n", {}, ":2:1: 'inf' is not a finite number"},
      {"1,-INF\n", {}, ":1:2: '-INF' is not a finite number"},
      // a tab or space delimiter keeps an empty first field (the columns would shift)
      {"\t1\t2\n\t3\t4\n", {.label_column = 0, .delimiter = '\t'},
       ":1:1: missing value (empty field) (label_column 0, counted from 0)"},
      {"\t1\t2\n", {.delimiter = '\t'}, ":1:1: missing value (empty field)"},
      {" 1 2\n", {.delimiter = ' '}, ":1:1: missing value (empty field)"},
      {"1\t\t2\n", {.delimiter = '\t'}, ":1:2: missing value (empty field)"},
      // ... and a row whose last field is empty where the others have one is a row too short
      {"1\t2\t3\n4\t5\t\n", {.delimiter = '\t'}, ":2:3: missing field: expected 3 fields (as the first data row, line 1)"},
      {"1\t2\t\n3\t4\t5\n", {.delimiter = '\t'}, ":2:3: extra field: expected 2 fields (as the first data row, line 1)"},
      // a row of tabs under a tab delimiter is a row of empty fields, not a blank line
      {"1\t2\n\t\n", {.delimiter = '\t'}, ":2:1: missing value (empty field)"},
      {"1\t2\n\t \t\r\n3\t4\n", {.delimiter = '\t'}, ":2:1: missing value (empty field)"},
      // two spaces make an empty field under a space delimiter
      {"1  2\n", {.delimiter = ' '}, ":1:2: missing value (empty field)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    std::ofstream(p) << c.text;
    const std::string msg = error_of([&] { (void)ld::csv(p, c.options); });
    CAPTURE(msg);
    CHECK(msg.find(p + c.where) != std::string::npos);
  }
  CHECK(error_of([&] { (void)ld::csv(dir.file("none.csv")); }) ==
        "lockstep::data::csv: " + dir.file("none.csv") + ": cannot open file: No such file or directory");
  CHECK(error_of([&] { (void)ld::csv(dir.path.string()); }) ==
        "lockstep::data::csv: " + dir.path.string() + ": read error: Is a directory");
  // Options that contradict each other are refused before the file is parsed.
  std::ofstream(p) << "1,2,3\n";
  CHECK(error_of([&] { (void)ld::csv(p, {.label_column = 1, .target_columns = {1}}); }) ==
        "lockstep::data::csv: " + p + ": column 1 (counted from 0) is both label_column and a target column");
  CHECK(error_of([&] { (void)ld::csv(p, {.target_columns = {2, 0, 2}}); }) ==
        "lockstep::data::csv: " + p + ": target_columns names column 2 (counted from 0) twice");
}

TEST_CASE("csv: a column number far beyond the file is refused naming the option, and nothing is sized by it") {
  temp_dir dir;
  const std::string p = dir.file("few.csv");
  std::ofstream(p) << "1,2,3\n4,5,6\n";
  const std::string huge = std::to_string(SIZE_MAX);
  struct bad_case {
    std::vector<std::size_t> targets;
    std::string what;
  };
  for (const auto& c : std::vector<bad_case>{{{0, SIZE_MAX}, huge},
                                             {{SIZE_MAX}, huge},
                                             {{std::size_t{1} << 40}, std::to_string(std::size_t{1} << 40)},
                                             {{std::size_t{1} << 28, 1}, std::to_string(std::size_t{1} << 28)}}) {
    CAPTURE(c.what);
    const std::string msg = error_of([&] { (void)ld::csv(p, {.target_columns = c.targets}); });
    CAPTURE(msg);
    CHECK(msg.find(p + ":1: target_columns names column " + c.what + ", which does not exist") != std::string::npos);
  }
  CHECK(error_of([&] { (void)ld::csv(p, {.target_columns = {SIZE_MAX, 1, SIZE_MAX}}); }) ==
        "lockstep::data::csv: " + p + ": target_columns names column " + huge + " (counted from 0) twice");
  CHECK(error_of([&] { (void)ld::csv(p, {.label_column = SIZE_MAX}); }).find(":1: label_column " + huge +
                                                                            " does not exist") != std::string::npos);
}

TEST_CASE("csv: spaces and tabs around a field, CRLF and blank lines are accepted") {
  temp_dir dir;
  const std::string p = dir.file("t.tsv");
  // Spaces and tabs around a field and at the end of a line, CRLF and blank lines (spaces only,
  // or spaces and tabs where the delimiter is not a tab) are accepted.
  std::ofstream(p) << "1\t 2 \t\r\n \n  \r\n3 \t4\n";
  std::vector<ld::owned_sample> rows;
  for (auto&& s : ld::csv(p, {.delimiter = '\t'}).epoch()) rows.emplace_back(s);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].features == std::vector<float>{1, 2});
  CHECK(rows[1].features == std::vector<float>{3, 4});
  std::ofstream(p) << "1, 2\t\r\n\t \r\n3 ,4\n";
  rows.clear();
  for (auto&& s : ld::csv(p).epoch()) rows.emplace_back(s);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].features == std::vector<float>{1, 2});
  CHECK(rows[1].features == std::vector<float>{3, 4});
  // space-separated output whose lines end with a space, after a header and a blank line of spaces
  std::ofstream(p) << "   \na b \n1 2 \n3 4  \r\n";
  rows.clear();
  for (auto&& s : ld::csv(p, {.header = true, .delimiter = ' '}).epoch()) rows.emplace_back(s);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].features == std::vector<float>{1, 2});
  CHECK(rows[1].features == std::vector<float>{3, 4});
}

TEST_CASE("csv: target columns give regression samples, and the other columns are the features") {
  temp_dir dir;
  const std::string p = dir.file("reg.csv");
  // Columns: x0, y1, x1, label, y0 (targets listed as {4, 1}: y0 first).
  std::ofstream(p) << "x0,y1,x1,label,y0\n1,10,2,3,100\n4,40,5,0,400\n\n7,70,8,1,700\n";
  const auto d = ld::csv(p, {.header = true, .label_column = 3, .target_columns = {4, 1}});
  std::vector<ld::owned_sample> rows;
  for (auto&& s : d.epoch()) rows.emplace_back(s);
  REQUIRE(rows.size() == 3);
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    const float base = static_cast<float>(3 * r + 1);
    CHECK(rows[r].features == std::vector<float>{base, base + 1});
    CHECK(rows[r].targets == std::vector<float>{100 * base, 10 * base});
    CHECK(rows[r].index == r);
  }
  CHECK(rows[0].label == 3);
  CHECK(rows[2].label == 1);
  // Batched: targets travel with their rows, target_width is the number of target columns.
  for (const std::size_t size : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
    CAPTURE(size);
    std::size_t seen = 0;
    for (auto&& b : (ld::csv(p, {.header = true, .target_columns = {4, 1}}) | ld::batched(size)).epoch()) {
      CHECK(b.width == 3);  // x0, x1 and the label column, which is a feature when not named
      CHECK(b.target_width == 2);
      REQUIRE(b.targets.size() == 2 * b.rows());
      for (std::size_t i = 0; i < b.rows(); ++i) {
        CHECK(b.targets[2 * i] == b.features[3 * i] * 100);
        CHECK(b.targets[2 * i + 1] == b.features[3 * i] * 10);
      }
      seen += b.rows();
    }
    CHECK(seen == 3);
  }
  // Every column a target: zero features.
  std::ofstream(p) << "1,2\n3,4\n";
  std::size_t n = 0;
  for (auto&& s : ld::csv(p, {.target_columns = {1, 0}}).epoch()) {
    CHECK(s.width == 0);
    CHECK(s.target_width == 2);
    n += s.targets[0] == s.targets[1] + 1 ? 1 : 0;
  }
  CHECK(n == 2);
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

namespace {

// Peak resident memory of this process so far, in MiB.
long peak_rss_mib() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

}  // namespace

TEST_CASE("idx: a header that declares more than the file holds allocates nothing for it") {
  // Each case declares at least 1 GiB in a file of a few bytes. The reader must find the file
  // truncated without first allocating (and zeroing) what the header declares, and the error is a
  // data_error naming the file, for plain and gzip files alike.
  temp_dir dir;
  struct huge_case {
    const char* what;
    std::vector<std::uint8_t> bytes;
    std::uint8_t rank;
    const char* expect;
  };
  const std::vector<huge_case> cases = {
      {"1 x 32768 x 32768 images", idx_bytes(0x803, {1, 32768, 32768}, 0), 3, "truncated file"},
      {"65536 x 4096 x 4096 images", idx_bytes(0x803, {65536, 4096, 4096}, 100), 3, "truncated file"},
      {"0xffffffff labels", idx_bytes(0x801, {0xffffffffu}, 3), 1, "truncated file"},
      {"0 x 65536 x 65536 images", idx_bytes(0x803, {0, 65536, 65536}, 0), 3, "byte offset 12: a sample of"},
  };
  const long before = peak_rss_mib();
  for (bool gz : {false, true}) {
    CAPTURE(gz);
    for (const auto& c : cases) {
      CAPTURE(c.what);
      const std::string p = dir.file(gz ? "huge.gz" : "huge");
      (gz ? write_gz : write_plain)(p, c.bytes);
      const std::string msg = error_of([&] {
        if (c.rank == 3) (void)ld::idx(p);
        else (void)ld::read_idx(p, 1);
      });
      CAPTURE(msg);
      CHECK(msg.find(p) != std::string::npos);
      CHECK(msg.find(c.expect) != std::string::npos);
    }
  }
  CHECK(peak_rss_mib() - before < 64);
}

TEST_CASE("idx: gzip offsets are in the decompressed stream, and nothing may follow the data") {
  temp_dir dir;
  const std::string ip = dir.file("images.gz");
  const auto images = idx_bytes(0x803, {300, 28, 28}, 300 * 784);
  write_gz(ip, images);
  const auto good = read_all(ip);

  // a corrupt byte deep in the deflate stream is reported past the header, in decompressed bytes
  for (std::size_t at : {good.size() / 2, good.size() * 3 / 4}) {
    CAPTURE(at);
    auto bad = good;
    for (std::size_t i = at; i < at + 16; ++i) bad[i] ^= 0xa5;
    write_plain(ip, bad);
    const std::string msg = error_of([&] { (void)ld::idx(ip); });
    CAPTURE(msg);
    CHECK(msg.find(ip + " (gzip; offsets in the decompressed stream): byte offset ") != std::string::npos);
    CHECK(msg.find("compressed offset") != std::string::npos);
    const auto at_pos = msg.find("byte offset ") + 12;
    CHECK(std::stoull(msg.substr(at_pos)) > 16);
    CHECK(std::stoull(msg.substr(at_pos)) <= images.size());
  }

  // trailing bytes are refused alike after a plain file's data and after the gzip stream
  for (const std::vector<std::uint8_t>& junk : std::vector<std::vector<std::uint8_t>>{{0}, {0x1f}, {'x', 'y', 'z'}, std::vector<std::uint8_t>(5000, 0)}) {
    CAPTURE(junk.size());
    auto bad = good;
    bad.insert(bad.end(), junk.begin(), junk.end());
    write_plain(ip, bad);
    std::string msg = error_of([&] { (void)ld::idx(ip); });
    CAPTURE(msg);
    CHECK(msg.find("byte offset " + std::to_string(images.size()) + ": trailing bytes after the gzip stream") !=
          std::string::npos);
    auto plain = images;
    plain.insert(plain.end(), junk.begin(), junk.end());
    const std::string pp = dir.file("images");
    write_plain(pp, plain);
    msg = error_of([&] { (void)ld::idx(pp); });
    CHECK(msg.find("byte offset " + std::to_string(images.size()) + ": trailing bytes") != std::string::npos);
  }

  // gzip members that follow one another form one stream (as gzip itself reads them)
  const std::size_t cut = 1000;
  write_gz(ip, std::vector<std::uint8_t>(images.begin(), images.begin() + cut));
  auto two = read_all(ip);
  write_gz(ip, std::vector<std::uint8_t>(images.begin() + cut, images.end()));
  const auto second = read_all(ip);
  two.insert(two.end(), second.begin(), second.end());
  write_plain(ip, two);
  const auto f = ld::read_idx(ip, 3);
  CHECK(f.bytes == images);
}

TEST_CASE("csv: a field quoted in a message is escaped and cut short") {
  temp_dir dir;
  const std::string p = dir.file("bad.csv");
  {
    std::ofstream out(p, std::ios::binary);
    out << "1,2\n3," << std::string(100000, '7') << "x\n";
  }
  std::string msg = error_of([&] { (void)ld::csv(p); });
  CAPTURE(msg.substr(0, 300));
  CHECK(msg.size() < p.size() + 200);
  CHECK(msg.find(":2:2: '77777777777777777777777777777777' (cut; the field has 100001 bytes) is not a number") !=
        std::string::npos);

  {
    std::ofstream out(p, std::ios::binary);
    out << "1,2\n3,a\rb\x1b[2J" << std::string(1, '\0') << "'\\\x7f\xff\n";
  }
  msg = error_of([&] { (void)ld::csv(p); });
  CAPTURE(msg);
  CHECK(msg.find(R"('a\x0db\x1b[2J\x00\'\\\x7f\xff' is not a number)") != std::string::npos);
  CHECK(std::none_of(msg.begin(), msg.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u >= 0x7f;
  }));
  {
    std::ofstream out(p, std::ios::binary);
    out << "1,2\n" << std::string(50000, '9') << ",0\n";
  }
  msg = error_of([&] { (void)ld::csv(p, {.label_column = 0}); });
  CHECK(msg.find(":2:1: label '99999999999999999999999999999999' (cut; the field has 50000 bytes) is out of range") !=
        std::string::npos);
}

TEST_CASE("csv: numbers are rounded to float and out of float range is its own error") {
  temp_dir dir;
  const std::string p = dir.file("n.csv");
  std::ofstream(p) << "1e-50,-1e-50,1e-40,1e-999,3.4e38,-3.4e38\n";
  std::vector<ld::owned_sample> rows;
  for (auto&& s : ld::csv(p).epoch()) rows.emplace_back(s);
  REQUIRE(rows.size() == 1);
  const std::vector<float> want = {0.0f, -0.0f, static_cast<float>(1e-40), 0.0f, 3.4e38f, -3.4e38f};
  REQUIRE(rows[0].features.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    CHECK(rows[0].features[i] == want[i]);
    CHECK(std::signbit(rows[0].features[i]) == std::signbit(want[i]));
  }
  CHECK(rows[0].features[2] > 0);  // a subnormal, not zero

  struct bad_case {
    const char* text;
    const char* where;
  };
  for (const auto& c : std::vector<bad_case>{{"1,3.5e38\n", ":1:2: '3.5e38' is out of range"},
                                             {"-1e39,1\n", ":1:1: '-1e39' is out of range"},
                                             {"1,1e999\n", ":1:2: '1e999' is out of range"},
                                             {"1,-0.000001e400\n", ":1:2: '-0.000001e400' is out of range"},
                                             {"1,+-5\n", ":1:2: '+-5' is not a number"},
                                             {"1,+\n", ":1:2: '+' is not a number"}}) {
    CAPTURE(c.text);
    std::ofstream(p) << c.text;
    const std::string msg = error_of([&] { (void)ld::csv(p); });
    CAPTURE(msg);
    CHECK(msg.find(p + c.where) != std::string::npos);
  }
}
