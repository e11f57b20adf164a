#pragma once
/// @file json.hpp
/// What the JSON that lockstep writes for other programs (safetensors headers, traces) needs of
/// JSON: strings, quoted and escaped; and the UTF-8 checks that its writers and readers (and the
/// TensorBoard writer's tags) share.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::io::detail {

/// The length of the well-formed UTF-8 sequence at s[i] (1 to 4 bytes; no overlong forms,
/// surrogates or values past U+10FFFF), or 0 when the bytes there are not one.
[[nodiscard]] inline std::size_t utf8_sequence(std::string_view s, std::size_t i) noexcept {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  std::uint32_t cp = 0, min = 0;
  if ((c & 0xe0) == 0xc0) n = 1, cp = c & 0x1fu, min = 0x80;
  else if ((c & 0xf0) == 0xe0) n = 2, cp = c & 0x0fu, min = 0x800;
  else if ((c & 0xf8) == 0xf0) n = 3, cp = c & 0x07u, min = 0x10000;
  else return 0;
  if (s.size() - i <= n) return 0;
  for (std::size_t k = 1; k <= n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3fu);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n + 1;
}

/// Whether `s` is well-formed UTF-8 (utf8_sequence at every character).
[[nodiscard]] inline bool valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// `s` quoted for an error message: '"' and '\\' escaped, and each control byte and each byte that
/// does not begin well-formed UTF-8 written as \xNN, so the message shows which byte is wrong.
[[nodiscard]] inline std::string quoted_for_message(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_sequence(s, i);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += s[i];
    } else if (c < 0x20 || n == 0) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out.append(s.substr(i, n));
      i += n - 1;
    }
  }
  out += '"';
  return out;
}

/// Appends `s` as a JSON string: quoted, with '"' and '\\' escaped and control characters
/// written as \u00XX; a byte that does not begin well-formed UTF-8 becomes U+FFFD (\ufffd), so
/// the output is valid JSON whatever `s` holds (writers whose readers need the exact name refuse
/// such names before: safetensors).
inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80) {
      const std::size_t n = utf8_sequence(s, i);
      if (n == 0) {
        out += "\\ufffd";
      } else {
        out.append(s.substr(i, n));
        i += n - 1;
      }
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace lockstep::io::detail
