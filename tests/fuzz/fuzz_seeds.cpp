// Writes the seed corpora of the fuzz harnesses: fuzz_seeds <dir> creates <dir>/idx, <dir>/csv,
// <dir>/checkpoint (also the seeds of fuzz_checkpoint_crc) and <dir>/safetensors. Every seed is built here, from
// the formats' own definitions, so the repository holds no binary blobs.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <lockstep/io/checkpoint.hpp>

#include "../support/legacy_checkpoint.hpp"
#include "checkpoint_body.hpp"
#include "common.hpp"
#include "safetensors_body.hpp"

namespace lf = lockstep::fuzz;
namespace fs = std::filesystem;

namespace {

void put_be32(lf::bytes& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

lf::bytes idx_file(std::uint32_t magic, const std::vector<std::uint32_t>& dims, std::size_t data) {
  lf::bytes out;
  put_be32(out, magic);
  for (auto d : dims) put_be32(out, d);
  for (std::size_t i = 0; i < data; ++i) out.push_back(static_cast<std::uint8_t>((i * 37 + 11) % 256));
  return out;
}

void write(const fs::path& dir, const std::string& name, const lf::bytes& b) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

lf::bytes text(const char* s) { return lf::bytes(s, s + std::strlen(s)); }

void idx_seeds(const fs::path& dir) {
  const lf::bytes images = idx_file(0x803, {3, 4, 5}, 60);
  lf::bytes labels = idx_file(0x801, {3}, 0);
  for (std::uint8_t l : {1, 0, 7}) labels.push_back(l);
  int n = 0;
  auto add = [&](std::uint8_t flags, const lf::bytes& im, const lf::bytes& lb) {
    write(dir, "seed-" + std::to_string(n++), lf::idx_input{flags, im, lb}.encode());
  };
  for (std::uint8_t flags = 0; flags < 8; ++flags) add(flags, images, labels);
  add(0, lf::gzip(images), lf::gzip(labels));            // gzip bytes as they are: mutations hit the deflate stream
  lf::bytes two = lf::gzip(lf::bytes(images.begin(), images.begin() + 30));
  const lf::bytes rest = lf::gzip(lf::bytes(images.begin() + 30, images.end()));
  two.insert(two.end(), rest.begin(), rest.end());
  add(0, two, labels);                                   // two gzip members
  add(0, idx_file(0x803, {1, 28, 28}, 784), idx_file(0x801, {1}, 1));
  add(3, idx_file(0x803, {2, 1, 1}, 2), idx_file(0x801, {2}, 2));
  add(0, idx_file(0x803, {0, 1, 1}, 0), idx_file(0x801, {0}, 0));
}

void csv_seeds(const fs::path& dir) {
  int n = 0;
  auto add = [&](std::uint8_t flags, std::uint8_t label, std::uint8_t delim, const char* s) {
    write(dir, "seed-" + std::to_string(n++), lf::csv_input{flags, label, delim, text(s)}.encode());
  };
  add(0, 0, 0, "1,2,3\n4,5,6\n");
  add(1, 0, 0, "a,b,c\n1.5,-2e3,+0.25\n\n7,8,9\r\n");
  add(3, 2, 0, "x,y,label\n0.1,0.2,3\n0.3,0.4,0\n");
  add(2, 0, 1, "2;1e-50;3.4e38\n0;-0;1E+5\n");
  add(0, 0, 2, "1\t2\n3\t4");
  add(2, 1, 3, "9|1|8\n7|2|6\n");
  add(0, 0, 0, "nan,inf\n1e999,-1e-999\n0x10,1..2\n");
}

lockstep::checkpoint_state state(std::size_t opt_per_param, std::size_t callbacks) {
  using net = lf::checkpoint_net;
  lockstep::checkpoint_state s;
  s.signature = lockstep::model_signature<net>();
  s.model_name = lockstep::io::model_name<net>();
  const std::size_t p = lockstep::model<net>::param_count;
  for (std::size_t i = 0; i < p; ++i) s.parameters.push_back(0.5f * static_cast<float>(i) - 2.0f);
  for (std::size_t i = 0; i < opt_per_param * p; ++i) s.optimizer_state.push_back(0.01f * static_cast<float>(i));
  s.step = 12;
  s.epoch = 2;
  s.batches = 3;
  s.base_lr = 0.1f;
  s.lr_factor = 0.5f;
  s.lr = 0.05f;
  s.seed = 7;
  s.data_seed = 9;
  s.replicas = 2;
  for (std::size_t c = 0; c < callbacks; ++c) s.callback_states.push_back({1.0 + double(c), 2.5, -3.0});
  s.epoch_loss_sum = 4.25;
  s.epoch_samples = 96;
  s.epoch_steps = 3;
  s.epoch_labelled = 96;
  s.epoch_correct = 40;
  return s;
}

void checkpoint_seeds(const fs::path& dir) {
  write(dir, "seed-adam", lockstep::encode_checkpoint(state(2, 2)));
  write(dir, "seed-momentum", lockstep::encode_checkpoint(state(1, 1)));
  auto fresh = state(0, 0);
  fresh.step = 0;
  write(dir, "seed-fresh", lockstep::encode_checkpoint(fresh));
  // formats 2 and 1, as the library wrote them before format 3
  write(dir, "seed-format2", lockstep::testing_support::legacy_checkpoint_bytes(state(2, 2), 2));
  auto v1 = lockstep::testing_support::legacy_checkpoint_bytes(state(1, 0), 1);
  lf::fix_checkpoint_crcs(v1);
  write(dir, "seed-v1", v1);
}

void safetensors_seeds(const fs::path& dir) {
  using net = lf::safetensors_net;
  std::vector<float> p(lockstep::model<net>::stored_count);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.125f * static_cast<float>(i % 37) - 2.0f;
  namespace io = lockstep::io;
  write(dir, "seed-f32", io::encode_safetensors<net>(p, 3));
  write(dir, "seed-bf16", io::encode_safetensors<net>(p, 0, {.dtype = io::safetensors_dtype::bf16}));
  write(dir, "seed-f16", io::encode_safetensors<net>(p, 9, {.dtype = io::safetensors_dtype::f16}));
  // as another writer lays it out: no metadata, tensors in reverse order in the header and the data
  const auto tensors = io::safetensors_tensors<net>();
  const auto ref = io::encode_safetensors<net>(p, 0);
  std::uint64_t n = 0;
  std::memcpy(&n, ref.data(), 8);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    const std::uint64_t bytes = t.elements() * (t.from == io::safetensors_entry::source::counter ? 8 : 4);
    ranges.emplace_back(at, at + bytes);
    at += bytes;
  }
  std::string json = "{";
  lf::bytes data;
  std::uint64_t pos = 0;
  for (std::size_t k = tensors.size(); k-- > 0;) {
    const auto& t = tensors[k];
    const auto [b, e] = ranges[k];
    std::string shape = "[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i) shape += ", ";
      shape += std::to_string(t.shape[i]);
    }
    json += (k + 1 == tensors.size() ? "" : ", ") + std::string("\"") + t.name + "\": {\"dtype\": \"" +
            (t.from == io::safetensors_entry::source::counter ? "I64" : "F32") + "\", \"shape\": " + shape +
            "], \"data_offsets\": [" + std::to_string(pos) + ", " + std::to_string(pos + (e - b)) + "]}";
    data.insert(data.end(), ref.begin() + static_cast<std::ptrdiff_t>(8 + n + b),
                ref.begin() + static_cast<std::ptrdiff_t>(8 + n + e));
    pos += e - b;
  }
  json += "}";
  while (json.size() % 8) json += ' ';
  lf::bytes file(8);
  const std::uint64_t len = json.size();
  std::memcpy(file.data(), &len, 8);
  file.insert(file.end(), json.begin(), json.end());
  file.insert(file.end(), data.begin(), data.end());
  write(dir, "seed-reordered", file);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds <dir>\n");
    return 2;
  }
  const fs::path root = argv[1];
  idx_seeds(root / "idx");
  csv_seeds(root / "csv");
  checkpoint_seeds(root / "checkpoint");
  safetensors_seeds(root / "safetensors");
  return 0;
}
