// image_folder and tar_shards: byte-wise sorted paths, class ids from sorted folder names, list
// files, groups, the same samples from a folder and from shards, and refusals naming the file.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

#include "data/images/fashion.hpp"

namespace ld = lockstep::data;
namespace fs = std::filesystem;

namespace {

// A w x h RGB image whose pixels encode `seed`.
std::vector<std::uint8_t> pixels(std::uint32_t w, std::uint32_t h, unsigned seed) {
  std::vector<std::uint8_t> p(w * h * 3);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(seed * 29 + i * 3);
  return p;
}

void write_file(const fs::path& p, const std::vector<std::uint8_t>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void write_png(const fs::path& p, unsigned seed, std::uint32_t w = 6, std::uint32_t h = 4) {
  const auto px = pixels(w, h, seed);
  write_file(p, ld::encode_png(px.data(), w, h, 3));
}

// Every sample of one epoch: index -> (label, features), through a cut for 2 replicas.
std::map<std::uint64_t, std::pair<std::int32_t, std::vector<float>>> samples_of(const ld::dataset<ld::index_batch>& d) {
  std::map<std::uint64_t, std::pair<std::int32_t, std::vector<float>>> out;
  for (auto&& b : d.epoch(0)) {
    const auto db = ld::detail::make_sharded(std::move(b), 2, 0, 2);
    for (const auto& s : db.shards)
      for (std::size_t r = 0; r < s.size; ++r)
        out[s.indices[r]] = {s.labels ? s.labels[r] : ld::no_label,
                             std::vector<float>(s.features + r * s.width, s.features + (r + 1) * s.width)};
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const lockstep::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("image_folder: byte-wise sorted paths, class ids from the sorted subfolders, groups by folder") {
  fashion_test::scratch_dir tmp;
  const fs::path root = fs::path(tmp.path()) / "set";
  // Created out of order; upper case sorts before lower case byte-wise; nested folders; other files.
  write_png(root / "cat" / "b.png", 1);
  write_png(root / "Zebra" / "x.PNG", 2);
  write_png(root / "cat" / "a.png", 3);
  write_png(root / "cat" / "deep" / "c.png", 4);
  write_png(root / "ant" / "z.png", 5);
  write_file(root / "cat" / "notes.txt", {'h', 'i'});
  const auto d = ld::image_folder(root.string());
  const auto& src = dynamic_cast<const ld::image_folder_source&>(d.source());
  REQUIRE(src.size() == 5);
  CHECK(src.classes() == std::vector<std::string>{"Zebra", "ant", "cat"});
  const std::vector<std::string> order{"Zebra/x.PNG", "ant/z.png", "cat/a.png", "cat/b.png", "cat/deep/c.png"};
  const std::vector<std::int32_t> labels{0, 1, 2, 2, 2};
  const std::vector<std::uint32_t> groups{0, 1, 2, 2, 3};
  const std::vector<unsigned> seeds{2, 5, 3, 1, 4};
  const auto got = samples_of(d | ld::batched(2));
  for (std::uint64_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(src.relative_path(i) == order[i]);
    CHECK(src.label(i) == labels[i]);
    CHECK(src.group(i) == groups[i]);
    CHECK(got.at(i).first == labels[i]);
    // channels-first RGB: channel k of pixel (y, x) at k * h * w + y * w + x
    const auto px = pixels(6, 4, seeds[i]);
    for (std::uint32_t k = 0; k < 3; ++k)
      for (std::uint32_t p = 0; p < 24; ++p) CHECK(got.at(i).second[k * 24 + p] == static_cast<float>(px[p * 3 + k]));
  }
  // Grey output: one channel.
  const auto grey = samples_of(ld::image_folder(root.string(), {.image = {.channels = 1}}) | ld::batched(5));
  CHECK(grey.at(0).second.size() == 24);
  // Refusals.
  CHECK(error_of([&] { (void)ld::image_folder((root / "missing").string()); }).find("not a folder") != std::string::npos);
  fs::create_directories(root / "empty");
  CHECK(error_of([&] { (void)ld::image_folder(root.string()); }).find("without images") != std::string::npos);
  fs::remove(root / "empty");
  write_png(root / "loose.png", 9);
  CHECK(error_of([&] { (void)ld::image_folder(root.string()); }).find("outside any class folder") != std::string::npos);
  fs::remove(root / "loose.png");
  CHECK_THROWS_AS(ld::image_folder(root.string(), {.image = {.channels = 2}}), lockstep::config_error);
}

TEST_CASE("image_folder: list files, different sizes, corrupt files") {
  fashion_test::scratch_dir tmp;
  const fs::path root = fs::path(tmp.path()) / "flat";
  write_png(root / "b.png", 1);
  write_png(root / "a b.png", 2);
  write_png(root / "sub" / "c.png", 3, 5, 4);  // another size
  const auto list = [&](const std::string& text) {
    const auto p = fs::path(tmp.path()) / "list.txt";
    std::ofstream(p) << text;
    return p.string();
  };
  const auto d = ld::image_folder(root.string(), {.list_file = list("b.png 7\na b.png 3\n\n")});
  const auto& src = dynamic_cast<const ld::image_folder_source&>(d.source());
  REQUIRE(src.size() == 2);
  CHECK(src.relative_path(0) == "a b.png");  // sorted, whatever the list's order
  CHECK(src.label(0) == 3);
  CHECK(src.label(1) == 7);
  const auto unlabelled = ld::image_folder(root.string(), {.list_file = list("b.png\nsub/c.png\n")});
  CHECK_FALSE(unlabelled.source().labels_in_index());
  // Images of different sizes in one batch: a shape_error naming the file; a resize fixes it.
  const auto mixed = unlabelled | ld::batched(2);
  const auto m = error_of([&] { (void)samples_of(mixed); });
  CHECK(m.find("sub/c.png") != std::string::npos);
  CHECK(m.find("resize or crop") != std::string::npos);
  CHECK(samples_of(unlabelled | ld::resize(4, 6) | ld::batched(2)).size() == 2);
  // Malformed lists.
  CHECK(error_of([&] { (void)ld::image_folder(root.string(), {.list_file = list("b.png 1\nsub/c.png\n")}); })
            .find("every line needs a label") != std::string::npos);
  CHECK(error_of([&] { (void)ld::image_folder(root.string(), {.list_file = list("b.png x\n")}); }).find("list.txt:1") !=
        std::string::npos);
  CHECK(error_of([&] { (void)ld::image_folder(root.string(), {.list_file = list("../b.png 1\n")}); }).find("'..'") !=
        std::string::npos);
  CHECK(error_of([&] { (void)ld::image_folder(root.string(), {.list_file = list("b.png 1\nb.png 2\n")}); })
            .find("listed twice") != std::string::npos);
  // A missing or corrupt file is reported at the cut, naming it.
  const auto gone = ld::image_folder(root.string(), {.list_file = list("b.png 1\nnope.png 2\n")}) | ld::batched(2);
  CHECK(error_of([&] { (void)samples_of(gone); }).find("nope.png") != std::string::npos);
  write_file(root / "bad.png", {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0});
  const auto bad = ld::image_folder(root.string(), {.list_file = list("b.png 1\nbad.png 2\n")}) | ld::batched(2);
  const auto mb = error_of([&] { (void)samples_of(bad); });
  CHECK(mb.find("bad.png: PNG: byte offset") != std::string::npos);
}

TEST_CASE("image_folder: a folder linked from several places is listed once, under its byte-wise first path") {
  fashion_test::scratch_dir tmp;
  const fs::path root = fs::path(tmp.path()) / "set", shared = fs::path(tmp.path()) / "shared";
  write_png(shared / "s.png", 7);
  // Eight classes link the same folder (in whatever order the file system lists them), and the
  // last one twice: it belongs to the first class, under its first name, on every machine.
  for (int c = 7; c >= 0; --c) {
    std::string name(1, 'c');  // appended: GCC 12 warns falsely on "c" + std::to_string(c)
    name += std::to_string(c);
    const fs::path cls = root / name;
    write_png(cls / "own.png", static_cast<unsigned>(c));
    fs::create_directory_symlink(shared, cls / "z_link");
    if (c == 7) fs::create_directory_symlink(shared, cls / "a_link");
  }
  const auto d = ld::image_folder(root.string());
  const auto& src = dynamic_cast<const ld::image_folder_source&>(d.source());
  REQUIRE(src.size() == 9);
  std::size_t shared_at = src.size();
  for (std::uint64_t i = 0; i < src.size(); ++i)
    if (src.relative_path(i).ends_with("/s.png")) {
      CHECK(shared_at == src.size());  // once
      shared_at = i;
    }
  REQUIRE(shared_at < src.size());
  CHECK(src.relative_path(shared_at) == "c0/z_link/s.png");
  CHECK(src.label(shared_at) == 0);
}

TEST_CASE("image stages: a crop that does not fit an image names its file") {
  fashion_test::scratch_dir tmp;
  const fs::path root = tmp.path();
  write_png(root / "cat" / "a.png", 1, 9, 9);
  write_png(root / "cat" / "b.png", 2, 6, 4);  // too small for an 8 x 8 crop without padding
  const auto crops = ld::image_folder(root.string()) | ld::random_crop(8, 8, 0, 3) | ld::batched(2);
  const std::string why = error_of([&] { (void)samples_of(crops); });
  CHECK(why.find((root / "cat" / "b.png").string()) != std::string::npos);
  CHECK(why.find("crop does not fit the 4x6 image padded by 0") != std::string::npos);
  // padded by 2, it fits
  CHECK(samples_of(ld::image_folder(root.string()) | ld::random_crop(8, 8, 2, 3) | ld::batched(2)).size() == 2);
}

TEST_CASE("tar_shards: the same samples as the folder they were made from and the refusals") {
  fashion_test::scratch_dir tmp;
  const fs::path dir = tmp.path();
  const std::size_t n = 23;
  std::ofstream list(dir / "list.txt");
  std::vector<std::unique_ptr<ld::tar_writer>> shards;
  for (int s = 0; s < 3; ++s) shards.push_back(std::make_unique<ld::tar_writer>((dir / ("s" + std::to_string(s) + ".tar")).string()));
  for (std::size_t i = 0; i < n; ++i) {
    const auto px = pixels(6, 4, static_cast<unsigned>(i));
    const bool jpeg = i % 3 == 0;
    const auto bytes = jpeg ? ld::encode_jpeg(px.data(), 6, 4, 3) : ld::encode_png(px.data(), 6, 4, 3);
    const std::string key = fashion_test::key(i), name = key + (jpeg ? ".jpg" : ".png");
    write_file(dir / "flat" / name, bytes);
    list << name << " " << i % 4 << "\n";
    shards[i * 3 / n]->add("sub/" + name, bytes.data(), bytes.size());
    shards[i * 3 / n]->add("sub/" + key + ".cls", std::to_string(i % 4));
  }
  list.close();
  for (auto& s : shards) s->close();
  const auto folder = samples_of(ld::image_folder((dir / "flat").string(), {.list_file = (dir / "list.txt").string()}) | ld::batched(4));
  std::mutex mutex;  // the hook is called from the load threads
  std::vector<std::string> reads;
  const auto tars = ld::tar_shards(dir.string(), {.on_read = [&](const std::string&, const std::string& m) {
                                                    std::lock_guard lock(mutex);
                                                    reads.push_back(m);
                                                  }});
  CHECK(tars.size() == n);
  for (std::uint64_t i = 0; i < n; ++i) CHECK(tars.source().group(i) == i * 3 / n);
  CHECK(samples_of(tars | ld::batched(4)) == folder);
  CHECK(reads.size() == 2 * n);  // each sample's label and image, once
  const auto rep = tars.report();
  CHECK(rep.index_bytes > 0);
  CHECK(rep.opens == 0);  // the shards stay open
  // A compressed shard is refused with the fix.
  write_file(dir / "x.tar.gz", {0x1f, 0x8b, 8, 0});
  const auto m = error_of([&] { (void)ld::tar_shards(dir.string()); });
  CHECK(m.find("gunzip") != std::string::npos);
  fs::remove(dir / "x.tar.gz");
  // So is a shard compressed otherwise, in the folder under its own suffix (it was skipped: its
  // samples silently missing).
  const std::vector<std::pair<std::string, std::vector<std::uint8_t>>> compressed = {
      {"x.tar.zst", {0x28, 0xb5, 0x2f, 0xfd, 0}},    {"x.tzst", {0x28, 0xb5, 0x2f, 0xfd, 0}},
      {"x.tar.xz", {0xfd, '7', 'z', 'X', 'Z', 0, 0}}, {"x.txz", {0xfd, '7', 'z', 'X', 'Z', 0, 0}},
      {"x.tar.bz2", {'B', 'Z', 'h', '9', 0}},         {"x.tbz2", {'B', 'Z', 'h', '9', 0}},
      {"x.tar.lz4", {0x04, 0x22, 0x4d, 0x18, 0}},     {"y.tar.lz4", {0x02, 0x21, 0x4c, 0x18, 0}}};  // lz4, legacy lz4
  for (const auto& shard_file : compressed) {
    const std::string& name = shard_file.first;  // not a structured binding: CAPTURE's lambda uses it
    CAPTURE(name);
    write_file(dir / name, shard_file.second);
    const std::string why = error_of([&] { (void)ld::tar_shards(dir.string()); });
    CHECK(why.find((dir / name).string()) != std::string::npos);
    CHECK(why.find("-compressed") != std::string::npos);
    fs::remove(dir / name);
  }
  // A folder without a shard is an error, not an empty dataset.
  fs::create_directories(dir / "empty");
  write_file(dir / "empty" / "notes.txt", {'a'});
  CHECK(error_of([&] { (void)ld::tar_shards((dir / "empty").string()); }).find("holds no .tar shard") !=
        std::string::npos);
  // A sample without an image, a label that is not a number, a missing label.
  const auto shard = [&](const std::vector<std::pair<std::string, std::string>>& members) {
    ld::tar_writer w((dir / "one.tar").string());
    for (const auto& [name, text] : members) w.add(name, text);
    w.close();
    return (dir / "one.tar").string();
  };
  CHECK(error_of([&] { (void)ld::tar_shards(std::vector<std::string>{shard({{"a.cls", "1"}})}); }).find("no image") !=
        std::string::npos);
  const auto png = ld::encode_png(pixels(2, 2, 0).data(), 2, 2, 3);
  const std::string p(png.begin(), png.end());
  // Image extensions ignore ASCII case (ImageNet's .JPEG), as image_folder's do; the exact one first.
  {
    const auto upper = ld::tar_shards(std::vector<std::string>{shard({{"a.PNG", p}, {"a.cls", "1"}, {"b.Png", p}, {"b.cls", "2"}})});
    CHECK(upper.size() == 2);
    CHECK(samples_of(upper | ld::batched(2)).size() == 2);
  }
  CHECK(error_of([&] { (void)ld::tar_shards(std::vector<std::string>{shard({{"a.png", p}, {"a.cls", "1"}, {"b.png", p}})}); })
            .find("has no .cls member") != std::string::npos);
  const auto notnum = ld::tar_shards(std::vector<std::string>{shard({{"a.png", p}, {"a.cls", "one"}})}) | ld::batched(1);
  CHECK(error_of([&] { (void)samples_of(notnum); }).find("not a decimal integer") != std::string::npos);
  // An image beyond image_limits::max_file_bytes is refused before a byte of it is read (a label
  // member of more than 32 bytes is refused when the shard is indexed).
  std::vector<std::string> read_members;
  const auto note = [&](const std::string&, const std::string& member) {
    std::lock_guard lock(mutex);
    read_members.push_back(member);
  };
  const auto small_limit = ld::tar_shards(std::vector<std::string>{shard({{"a.png", p}, {"a.cls", "1"}})},
                                          {.image = {.limits = {.max_file_bytes = p.size() - 1}}, .on_read = note}) |
                           ld::batched(1);
  std::string why = error_of([&] { (void)samples_of(small_limit); });
  CHECK(why.find("member 'a.png'") != std::string::npos);
  CHECK(why.find(std::to_string(p.size()) + " bytes, beyond image_limits::max_file_bytes") != std::string::npos);
  CHECK(read_members == std::vector<std::string>{"a.cls"});  // the label only
  read_members.clear();
  why = error_of([&] {
    (void)ld::tar_shards(std::vector<std::string>{shard({{"a.png", p}, {"a.cls", std::string(5000, ' ') + "1"}})},
                         {.on_read = note});
  });
  CHECK(why.find("the label member 'a.cls' holds 5001 bytes, not a class number") != std::string::npos);
  CHECK(read_members.empty());
}
