#pragma once
// Writes small tar archives (POSIX ustar) in memory, for the tests, the fuzz seeds and the
// benchmarks: members with names up to 100 bytes (or a GNU long-name record first), any type.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace tar_test {

/// The bytes of a tar archive under construction.
class writer {
public:
  /// Appends a member: its header (type `type`) and its data padded to 512 bytes.
  void add(const std::string& name, const std::vector<std::uint8_t>& data, char type = '0') {
    if (name.size() > 100) {  // a GNU long-name record, then the member under a short name
      std::vector<std::uint8_t> long_name(name.begin(), name.end());
      long_name.push_back(0);
      header("././@LongLink", long_name.size(), 'L');
      body(long_name);
      header(name.substr(0, 99), data.size(), type);
    } else {
      header(name, data.size(), type);
    }
    body(data);
  }
  /// Appends a member with text data.
  void add(const std::string& name, const std::string& text) { add(name, std::vector<std::uint8_t>(text.begin(), text.end())); }
  /// Appends a pax extended header record set (`key=value` pairs) for the next member.
  void pax(const std::vector<std::pair<std::string, std::string>>& records) {
    std::string d;
    for (const auto& [k, v] : records) {
      const std::string body = " " + k + "=" + v + "\n";
      std::size_t len = body.size() + 1;
      while (std::to_string(len).size() + body.size() != len) ++len;
      d += std::to_string(len) + body;
    }
    header("PaxHeaders/x", d.size(), 'x');
    body(std::vector<std::uint8_t>(d.begin(), d.end()));
  }
  /// The archive with its two end-of-archive blocks.
  [[nodiscard]] std::vector<std::uint8_t> finish() const {
    std::vector<std::uint8_t> out = bytes_;
    out.resize(out.size() + 1024, 0);
    return out;
  }
  /// Writes finish() to `path`.
  void write(const std::string& path) const {
    const auto b = finish();
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }

private:
  void header(const std::string& name, std::size_t size, char type) {
    std::uint8_t h[512] = {};
    std::memcpy(h, name.data(), std::min<std::size_t>(name.size(), 100));
    std::snprintf(reinterpret_cast<char*>(h + 100), 8, "%07o", 0644);
    std::snprintf(reinterpret_cast<char*>(h + 108), 8, "%07o", 0);
    std::snprintf(reinterpret_cast<char*>(h + 116), 8, "%07o", 0);
    std::snprintf(reinterpret_cast<char*>(h + 124), 12, "%011llo", static_cast<unsigned long long>(size));
    std::snprintf(reinterpret_cast<char*>(h + 136), 12, "%011o", 0);
    h[156] = static_cast<std::uint8_t>(type);
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (std::uint8_t b : h) sum += b;
    std::snprintf(reinterpret_cast<char*>(h + 148), 8, "%06o", sum);
    h[155] = ' ';
    bytes_.insert(bytes_.end(), h, h + 512);
  }
  void body(const std::vector<std::uint8_t>& d) {
    bytes_.insert(bytes_.end(), d.begin(), d.end());
    bytes_.resize((bytes_.size() + 511) / 512 * 512, 0);
  }
  std::vector<std::uint8_t> bytes_;
};

}  // namespace tar_test
