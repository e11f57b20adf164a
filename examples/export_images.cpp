// Writes an IDX data set (by default Fashion-MNIST's train and t10k splits) as the two image layouts
// lockstep reads index first, for `fashion_mnist --data-format png-folder|tar-shards`:
//
//   OUT/train/NNNNN.png with the list file OUT/train.txt ("NNNNN.png label" lines), the same for t10k;
//   OUT/train-SSSSSS.tar, OUT/t10k-SSSSSS.tar: WebDataset shards of NNNNN.png + NNNNN.cls.
//
// PNG is lossless, so both decode to the IDX bytes.
//
// usage: export_images OUT [IDX_DIR] [SHARDS]   (default /usr/share/datasets/fashion-mnist, 8 shards;
// SHARDS from 1 to 256, each shard an open file while a split is written)
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

namespace ld = lockstep::data;

namespace {

constexpr std::size_t max_shards = 256;

std::string padded(std::size_t v, std::size_t width) {
  const std::string s = std::to_string(v);
  return std::string(s.size() < width ? width - s.size() : 0, '0') + s;
}

void export_split(const std::string& idx_dir, const std::string& out, const std::string& split, std::size_t shards) {
  namespace fs = std::filesystem;
  const auto t = ld::idx_table(idx_dir + "/" + split + "-images-idx3-ubyte.gz", idx_dir + "/" + split + "-labels-idx1-ubyte.gz");
  const auto side = static_cast<std::uint32_t>(t->width == 784 ? 28 : 0);
  if (side == 0) throw std::runtime_error("export_images: expected 28 x 28 images");
  fs::create_directories(fs::path(out) / split);
  const fs::path list_path = fs::path(out) / (split + ".txt");
  std::ofstream list(list_path);
  if (!list) throw std::runtime_error("export_images: cannot create " + list_path.string());
  std::vector<std::unique_ptr<ld::tar_writer>> tars;
  for (std::size_t s = 0; s < shards; ++s)
    tars.push_back(std::make_unique<ld::tar_writer>(out + "/" + split + "-" + padded(s, 6) + ".tar"));
  for (std::size_t i = 0; i < t->rows; ++i) {
    const auto png = ld::encode_png(t->bytes.data() + t->byte_offset + i * t->width, side, side, 1);
    const std::string key = padded(i, 5), label = std::to_string(t->labels[i]);
    const fs::path png_path = fs::path(out) / split / (key + ".png");
    std::ofstream file(png_path, std::ios::binary);
    file.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
    file.close();
    if (!file) throw std::runtime_error("export_images: cannot write " + png_path.string());
    list << key << ".png " << label << "\n";
    auto& tar = *tars[i * shards / t->rows];  // consecutive samples per shard
    tar.add(key + ".png", png.data(), png.size());
    tar.add(key + ".cls", label);
  }
  list.close();
  if (!list) throw std::runtime_error("export_images: cannot write " + list_path.string());
  for (auto& tar : tars) tar->close();
  std::printf("%s: %zu images -> %s/%s/ (+ %s.txt) and %zu shards %s-*.tar\n", split.c_str(), t->rows, out.c_str(),
              split.c_str(), split.c_str(), shards, split.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "usage: export_images OUT [IDX_DIR] [SHARDS]\n";
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(usage, stdout);
    return 0;
  }
  if (argc < 2 || argc > 4 || argv[1][0] == '-' || argv[1][0] == '\0') {  // OUT is a directory, not an option
    std::fputs(usage, stderr);
    return 2;
  }
  const std::string out = argv[1];
  const std::string idx_dir = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
  std::size_t shards = 8;
  if (argc > 3) {
    const std::string text = argv[3];
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), shards);
    if (ec != std::errc{} || end != text.data() + text.size() || shards == 0 || shards > max_shards) {
      std::fprintf(stderr, "export_images: SHARDS must be an integer from 1 to %zu, got '%s'\n", max_shards, text.c_str());
      return 2;
    }
  }
  try {
    for (const char* split : {"train", "t10k"}) export_split(idx_dir, out, split, shards);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
